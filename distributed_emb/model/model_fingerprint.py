"""One digest of a saved model's files, for everything that keys work on "this exact model":
the embedding job's settings (vectors/embedding_settings.py: a resumed run must add shards made
by the same model) and the MCR² embedding cache (mcr2/embeddings.py: a cached vector is reused
only for the model that made it)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow.fs as pafs

from distributed_emb.storage import filesystem_of, is_remote


def model_fingerprint(location: str) -> str | None:
    """A digest of the model's files: their names and content for a local directory (a model
    retrained into the same directory is another model; a file touched but unchanged is the
    same one), names, sizes and times on object storage (reading a remote model whole only to
    hash it would cost a download); None for a hub name."""
    digest = hashlib.sha256()
    if is_remote(location):
        filesystem, path = filesystem_of(location)
        found = filesystem.get_file_info(pafs.FileSelector(path, recursive=True))
        stamps = sorted((i.path, i.size, str(i.mtime)) for i in found if i.type.name == "File")
        digest.update(repr(stamps).encode())
        return digest.hexdigest()[:32]
    root = Path(location)
    if not root.is_dir():
        return None
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()[:32]
