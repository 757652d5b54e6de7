"""Where a corpus lives → the exact list of files to read, on whatever filesystem holds them.

One resolver for every input of the project (sentence corpora, document corpora, InfoCSE pair
tables, MCR² inputs). A source is any of:

- a local file, a directory (read recursively) or a glob (``shards/*.jsonl.gz``);
- an object-store URI (``s3://bucket/prefix/``, ``gs://bucket/file.parquet``), listed and
  read through ``pyarrow.fs`` (credentials and endpoints from the usual environment, e.g.
  ``AWS_ENDPOINT_URL`` for an S3-compatible server);
- a Hugging Face dataset: a local ``save_to_disk`` directory (its ``.arrow`` files), or a hub
  name (``org/name`` or ``hf://datasets/org/name``) whose Parquet files are read in place
  through the hub's fsspec filesystem (needs ``HF_HUB_OFFLINE=0``).

Each file is read by its own suffix: ``.txt``, ``.jsonl``/``.json``, ``.parquet``,
``.arrow``, optionally compressed (``.gz``, ``.zst``, ``.bz2``). A file with any other suffix is
an error that lists it: nothing is skipped silently. Hidden and bookkeeping files (names starting
with ``.`` or ``_``, such as ``_SUCCESS``, and a saved HF dataset's JSON metadata) are not data.

Only the listing happens on the driver (names and sizes, never contents); the files themselves
are read by Ray Data tasks on the cluster (data/readers.py).
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pyarrow.fs as pafs

from distributed_emb.checks import require as _require
from distributed_emb.errors import UserInputError

FORMATS = {
    ".txt": "txt",
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".parquet": "parquet",
    ".arrow": "arrow",
}
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".bz2": "bz2"}
# A saved Hugging Face dataset's bookkeeping, next to its .arrow files.
HF_METADATA = {"dataset_info.json", "state.json", "dataset_dict.json"}
REMOTE_SCHEMES = ("s3://", "gs://", "gcs://", "hdfs://", "abfs://", "abfss://")
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


class CorpusError(UserInputError):
    """A corpus cannot be read at all (missing, unknown suffix, missing column); names it."""


@dataclass(frozen=True)
class SourceFile:
    path: str  # as `filesystem` names it
    format: str  # txt | jsonl | parquet | arrow
    compression: str | None  # gzip | zstd | bz2 | None
    index: int  # position in the sorted listing of all sources: the high bits of row ids
    size: int | None = None


@dataclass
class CorpusFiles:
    """Every file of one or more sources, in a fixed order, with the filesystem to read them.

    Several sources may live on different filesystems: each file keeps its own."""

    specs: list[str]
    files: list[SourceFile]
    filesystems: list[pafs.FileSystem]  # one per file, parallel to `files`

    @property
    def total_bytes(self) -> int:
        return sum(f.size or 0 for f in self.files)

    def describe(self) -> str:
        formats = sorted(
            {f.format + (f".{f.compression}" if f.compression else "") for f in self.files}
        )
        return f"{len(self.files)} file(s) ({', '.join(formats)}) from {', '.join(self.specs)}"


def file_format(name: str) -> tuple[str, str | None] | None:
    """(format, compression) from a file name's suffixes, or None when it is not a corpus file."""
    suffixes = [s.lower() for s in PurePosixPath(name).suffixes]
    compression = None
    if suffixes and suffixes[-1] in COMPRESSIONS:
        compression = COMPRESSIONS[suffixes.pop()]
    if suffixes and suffixes[-1] in FORMATS:
        return FORMATS[suffixes[-1]], compression
    return None


def is_hub_name(spec: str) -> bool:
    """`org/name` or `name` that is not a local path: a Hugging Face hub dataset."""
    if spec.startswith("hf://"):
        return True
    if spec.startswith((".", "/", "~")) or "://" in spec or os.path.exists(spec):
        return False
    return _HUB_NAME.fullmatch(spec) is not None and not PurePosixPath(spec).suffix


def is_remote(spec: str) -> bool:
    return spec.startswith(REMOTE_SCHEMES) or spec.startswith("hf://")


def _is_bookkeeping(name: str) -> bool:
    base = PurePosixPath(name).name
    return base.startswith((".", "_")) or base in HF_METADATA


def _hub_filesystem() -> pafs.FileSystem:
    """The Hugging Face hub as a pyarrow filesystem (fsspec's HfFileSystem). Tests replace it."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        raise CorpusError(
            "a hub dataset needs the hub, and HF_HUB_OFFLINE=1 is set: set HF_HUB_OFFLINE=0 on a "
            "machine that reaches the hub, or download the dataset and pass its directory"
        )
    from huggingface_hub import HfFileSystem  # offline: imported after cli sets HF_HUB_OFFLINE

    return pafs.PyFileSystem(pafs.FSSpecHandler(HfFileSystem()))


def _list(
    filesystem: pafs.FileSystem, root: str, pattern: str | None = None
) -> list[pafs.FileInfo]:
    """Files under `root` (recursively), or `root` itself when it is a file."""
    info = filesystem.get_file_info(root)
    if info.type == pafs.FileType.File:
        return [info]
    if info.type == pafs.FileType.NotFound:
        return []
    found = filesystem.get_file_info(pafs.FileSelector(root, recursive=True))
    found = [f for f in found if f.type == pafs.FileType.File]
    if pattern is not None:
        found = [f for f in found if fnmatch.fnmatch(f.path, pattern)]
    return found


def _hf_saved_dataset_dir(root: str, split: str) -> str | None:
    """The directory holding a `save_to_disk` dataset's .arrow files for `split`, if any."""
    path = Path(root)
    if not path.is_dir():
        return None
    if (path / "dataset_dict.json").is_file():
        if not (path / split).is_dir():
            splits = sorted(p.name for p in path.iterdir() if p.is_dir())
            raise CorpusError(f"{root}: saved dataset has no split {split!r} (splits: {splits})")
        return str(path / split)
    if (path / "state.json").is_file() or (path / "dataset_info.json").is_file():
        return str(path)
    return None


def _hub_files(spec: str, split: str) -> tuple[pafs.FileSystem, list[pafs.FileInfo]]:
    """The Parquet files of a hub dataset's split (the hub stores datasets as Parquet, or has
    a Parquet conversion under refs/convert/parquet)."""
    name = spec.removeprefix("hf://").removeprefix("datasets/")
    try:
        filesystem = _hub_filesystem()
    except CorpusError as error:
        raise CorpusError(f"hub dataset {name!r}: {error}") from None
    root = f"datasets/{name}"
    candidates = [f for f in _list(filesystem, root) if file_format(f.path) == ("parquet", None)]
    if not candidates:
        converted = f"datasets/{name}@refs%2Fconvert%2Fparquet"
        candidates = [f for f in _list(filesystem, converted) if f.path.endswith(".parquet")]

    def in_split(path: str) -> bool:
        parts = PurePosixPath(path).parts
        base = PurePosixPath(path).name
        return split in parts[:-1] or base.startswith((f"{split}-", f"{split}.", f"{split}_"))

    files = [f for f in candidates if in_split(f.path)]
    if not files:
        raise CorpusError(
            f"hub dataset {name!r}: no Parquet files for split {split!r} "
            f"({len(candidates)} Parquet file(s) in other splits)"
        )
    return filesystem, files


def _resolve_one(spec: str, split: str) -> tuple[pafs.FileSystem, list[pafs.FileInfo]]:
    if is_hub_name(spec):
        return _hub_files(spec, split)
    if is_remote(spec):
        if "*" in spec:  # list from the fixed prefix, then match the whole pattern
            prefix = spec.split("*", 1)[0].rsplit("/", 1)[0]
            filesystem, root = pafs.FileSystem.from_uri(prefix)
            return filesystem, _list(filesystem, root, spec.split("://", 1)[1])
        filesystem, root = pafs.FileSystem.from_uri(spec)
        return filesystem, _list(filesystem, root.rstrip("/") or root)
    filesystem = pafs.LocalFileSystem()
    if any(ch in spec for ch in "*?["):
        infos: list[pafs.FileInfo] = []
        for match in sorted(glob.glob(os.path.expanduser(spec), recursive=True)):
            infos.extend(_list(filesystem, str(Path(match).resolve())))
        return filesystem, infos
    local = Path(spec).expanduser()
    saved = _hf_saved_dataset_dir(str(local), split)
    if saved is not None:
        return filesystem, _list(filesystem, str(Path(saved).resolve()), "*.arrow")
    return filesystem, _list(filesystem, str(local.resolve()))


def resolve_sources(specs: str | list[str], hf_split: str = "train") -> CorpusFiles:
    """Every data file of `specs`, sorted within each source, numbered across all of them.

    Raises CorpusError naming the source when it holds no data file, and listing every file
    whose suffix is not a corpus format."""
    specs = [specs] if isinstance(specs, str) else list(specs)
    if not specs:
        raise CorpusError("no corpus source given")
    files: list[SourceFile] = []
    filesystems: list[pafs.FileSystem] = []
    for spec in specs:
        try:
            filesystem, infos = _resolve_one(spec, hf_split)
        except OSError as error:  # a missing bucket, a refused listing: named by its source
            raise CorpusError(f"{spec}: {error}") from None
        infos = sorted((f for f in infos if not _is_bookkeeping(f.path)), key=lambda f: f.path)
        unknown = [f.path for f in infos if file_format(f.path) is None]
        if unknown:
            listed = ", ".join(unknown[:10]) + (
                f" (+{len(unknown) - 10} more)" if len(unknown) > 10 else ""
            )
            raise CorpusError(
                f"{spec}: cannot tell the format of {len(unknown)} file(s): {listed}; corpus files "
                f"end in {', '.join(FORMATS)} (optionally {', '.join(COMPRESSIONS)})"
            )
        if not infos:
            raise CorpusError(f"{spec}: does not exist or holds no data files")
        for info in infos:
            fmt, compression = file_format(info.path)
            files.append(SourceFile(info.path, fmt, compression, len(files), info.size))
            filesystems.append(filesystem)
    return CorpusFiles(specs, files, filesystems)


def require_sources(paths: list[str], key: str) -> None:
    """Each data source exists here, unless data/sources.py reads it from elsewhere.

    Object-store URIs (s3://, gs://, ...) and hub datasets ('org/name', 'name',
    hf://datasets/org/name) cannot be checked here; a local path, directory or glob must
    exist or match. 'corpus/docs.jsonl' is a missing file, not a hub name (it has a suffix).
    """
    for path in paths:
        if is_remote(path) or is_hub_name(path):
            continue
        if any(ch in path for ch in "*?["):
            _require(
                bool(glob.glob(os.path.expanduser(path), recursive=True)),
                key,
                f"{path} matches no file",
            )
            continue
        _require(
            Path(path).expanduser().exists(),
            key,
            f"{path} does not exist (a Hugging Face hub dataset is named 'org/name' or "
            "hf://datasets/org/name)",
        )
