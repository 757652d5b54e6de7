"""Copies of a run's results onto its storage path (s3://, gs://, or a shared directory).

Ray Train already keeps checkpoints there; the exported model and metrics.json are written on
the driver first (where the job runs) and copied next to the checkpoints, so everything a run
produced outlives the node that ran it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow.fs as pafs

from distributed_emb.atomic_files import write_bytes_atomic
from distributed_emb.errors import UserInputError

log = logging.getLogger(__name__)


def run_uri(storage_path: str, run_name: str) -> str:
    return f"{storage_path.rstrip('/')}/{run_name}"


def copy_to_storage(local_path: str | Path, uri: str) -> str:
    """Copy a local file or directory to `uri` (any pyarrow filesystem URI or local path)."""
    local = Path(local_path).resolve()
    if "://" in uri:
        filesystem, target = pafs.FileSystem.from_uri(uri)
    else:
        filesystem, target = pafs.LocalFileSystem(), str(Path(uri).resolve())
    if local.is_dir():
        filesystem.create_dir(target, recursive=True)
    else:
        filesystem.create_dir(target.rsplit("/", 1)[0], recursive=True)
    pafs.copy_files(
        str(local),
        target,
        source_filesystem=pafs.LocalFileSystem(),
        destination_filesystem=filesystem,
    )
    log.info("copied %s to %s", local, uri)
    return uri


# ---------------------------------------------------------------------------------------------
# Locations: one string names a place on object storage (s3://, gs://) or a local path, and
# these read and write either. State that another node needs (a round's model and pairs, the
# rounds' table) is written through them, so it is where every node can reach it.
# ---------------------------------------------------------------------------------------------


def is_remote(location: str | Path) -> bool:
    return "://" in str(location)


def join(location: str | Path, *parts: str) -> str:
    """`location/part/...`, for a URI as for a local path."""
    return "/".join([str(location).rstrip("/"), *parts])


def filesystem_of(location: str | Path) -> tuple[pafs.FileSystem, str]:
    """(pyarrow filesystem, path in it) of a local path or a URI."""
    if is_remote(location):
        return pafs.FileSystem.from_uri(str(location))
    return pafs.LocalFileSystem(), str(Path(location).resolve())


def require_reachable(location: str | None, key: str) -> None:
    """Object storage the run will write to exists and answers, checked before Ray starts: a
    misspelt bucket or missing credentials fail here, naming the key, not after the cluster
    has started. A local path is created where it is used."""
    if location is None or not is_remote(location):
        return
    filesystem, path = filesystem_of(location)
    bucket = path.split("/", 1)[0]
    try:
        found = filesystem.get_file_info(bucket)
    except OSError as error:
        raise UserInputError(f"{key}: {location}: {error}") from None
    if found.type == pafs.FileType.NotFound:
        raise UserInputError(f"{key}: {location}: the bucket {bucket!r} does not exist")


def exists(location: str | Path) -> bool:
    filesystem, path = filesystem_of(location)
    return filesystem.get_file_info(path).type != pafs.FileType.NotFound


def has_files(location: str | Path) -> bool:
    """Is `location` a directory (or prefix) holding anything?"""
    filesystem, path = filesystem_of(location)
    if filesystem.get_file_info(path).type != pafs.FileType.Directory:
        return False
    return bool(filesystem.get_file_info(pafs.FileSelector(path, allow_not_found=True)))


def write_bytes(location: str | Path, data: bytes) -> None:
    """Write a file whole: atomically on a local disk (rename), and as one PUT on object
    storage (readers see the old object or the new one, never half)."""
    if not is_remote(location):
        write_bytes_atomic(location, data)
        return
    filesystem, path = filesystem_of(location)
    filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with filesystem.open_output_stream(path) as stream:
        stream.write(data)


def write_text(location: str | Path, text: str) -> None:
    """A small text file written whole (write_bytes)."""
    write_bytes(location, text.encode())


def read_bytes(location: str | Path) -> bytes | None:
    """The file's content, or None where there is none."""
    filesystem, path = filesystem_of(location)
    if filesystem.get_file_info(path).type != pafs.FileType.File:
        return None
    with filesystem.open_input_stream(path) as stream:
        return stream.read()


def read_text(location: str | Path) -> str | None:
    """The file's text, or None where there is none."""
    data = read_bytes(location)
    return None if data is None else data.decode()


def delete_tree(location: str | Path) -> None:
    """Remove a directory (or prefix) and everything under it; nothing there is fine."""
    filesystem, path = filesystem_of(location)
    if filesystem.get_file_info(path).type == pafs.FileType.Directory:
        filesystem.delete_dir(path)


def delete_file(location: str | Path) -> None:
    filesystem, path = filesystem_of(location)
    if filesystem.get_file_info(path).type == pafs.FileType.File:
        filesystem.delete_file(path)


def list_dirs(location: str | Path) -> list[str]:
    """The directories directly under `location`, as locations (same scheme), sorted."""
    return _entries(location, pafs.FileType.Directory)


def list_files(location: str | Path) -> list[str]:
    """The files directly under `location`, as locations (same scheme), sorted."""
    return _entries(location, pafs.FileType.File)


def _entries(location: str | Path, kind: pafs.FileType) -> list[str]:
    filesystem, path = filesystem_of(location)
    if filesystem.get_file_info(path).type != pafs.FileType.Directory:
        return []
    found = filesystem.get_file_info(pafs.FileSelector(path))
    return [join(location, name) for name in sorted(i.base_name for i in found if i.type == kind)]


def copy_from_storage(location: str | Path, local_dir: str | Path) -> str:
    filesystem, path = filesystem_of(location)
    Path(local_dir).mkdir(parents=True, exist_ok=True)
    pafs.copy_files(
        path, str(local_dir), source_filesystem=filesystem,
        destination_filesystem=pafs.LocalFileSystem(),
    )  # fmt: skip
    return str(local_dir)


def local_model_dir(location: str) -> str:
    """A model directory this process can open: a local path or hub name as given; a model on
    object storage copied once to this node's temp dir and reused by every process of the
    node. The copy is keyed by the URI and its files' sizes and modification times, so a
    model written again at the same URI (a rerun round) is copied again."""
    if not is_remote(location):
        return location
    import hashlib
    import os
    import shutil
    import tempfile

    filesystem, path = filesystem_of(location)
    files = filesystem.get_file_info(pafs.FileSelector(path, recursive=True))
    if not any(info.type == pafs.FileType.File for info in files):
        raise FileNotFoundError(f"no model at {location}")
    stamp = sorted((info.path, info.size, str(info.mtime)) for info in files)
    key = hashlib.sha1(repr((location, stamp)).encode()).hexdigest()[:16]
    target = Path(tempfile.gettempdir()) / "distributed_emb_models" / key
    if target.is_dir():
        return str(target)
    # Copied beside the target and renamed into place: processes of one node that copy at
    # once each rename a whole copy; the loser's rename fails and its copy is dropped.
    target.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f"{key}-", dir=target.parent))
    copy_from_storage(location, staged)
    try:
        os.rename(staged, target)
    except OSError:
        shutil.rmtree(staged, ignore_errors=True)
    log.info("copied the model at %s to %s", location, target)
    return str(target)
