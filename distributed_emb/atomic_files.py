"""Crash-safe outputs: a reader (or the next run) sees the previous file or directory, or the new
one, never a half-written mix.

A run killed mid-write (OOM killer, preemption, Ctrl-C, a full disk) used to leave a truncated
``metrics.json`` or a model directory with weights but no ``modules.json``; the next run or a
downstream job then failed far from the cause, or silently loaded the wrong thing.

- :func:`write_text_atomic`, :func:`write_bytes_atomic`: write a temporary file in the same
  directory, fsync it, then ``os.replace`` it over the target (atomic on POSIX and Windows
  within one file system).
- :func:`staged_directory` / :func:`replace_directory`: build a directory as a hidden sibling,
  then swap it in. An existing directory is moved aside first and deleted only after the new one
  is in place, so a failure before the swap leaves it untouched; a crash in the instant between
  the two renames leaves it as ``.NAME.old-*`` next to the target, whole.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path


def _sibling(path: Path, tag: str) -> Path:
    # Hidden and unique: concurrent writers never share a temp name, and `ls` stays clean.
    return path.with_name(f".{path.name}.{tag}-{uuid.uuid4().hex[:12]}")


def _fsync_directory(directory: Path) -> None:
    """Persist a rename: without this the new name can be lost on power failure (ext4, xfs)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # Windows cannot open a directory; renames there are durable enough
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems (e.g. network mounts) refuse fsync on a directory
    finally:
        os.close(fd)


def write_text_atomic(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> None:
    """Replace `path` with `text` in one step; on any failure the previous file is untouched."""
    write_bytes_atomic(path, text.encode(encoding))


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Replace `path` with `data` in one step; on any failure the previous file is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _sibling(path, "tmp")
    # os.open with 0o666 honours the umask, like a plain open() would (mkstemp forces 0o600).
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    _fsync_directory(path.parent)


def replace_directory(tmp_dir: str | os.PathLike, final_dir: str | os.PathLike) -> None:
    """Swap the finished directory `tmp_dir` in as `final_dir` (they must be siblings).

    An existing `final_dir` is renamed aside, the new one renamed in, and only then is the old
    one deleted; if the second rename fails the old one is put back.
    """
    tmp_dir, final_dir = Path(tmp_dir), Path(final_dir)
    if not tmp_dir.is_dir():
        raise FileNotFoundError(f"{tmp_dir}: not a directory to move into place")
    if tmp_dir.parent.resolve() != final_dir.parent.resolve():
        # A rename across directories may cross file systems, where it is a copy, not atomic.
        raise ValueError(f"{tmp_dir} must be in the same directory as {final_dir}")
    old = None
    if final_dir.exists() or final_dir.is_symlink():
        old = _sibling(final_dir, "old")
        os.replace(final_dir, old)
    try:
        os.replace(tmp_dir, final_dir)
    except BaseException:
        if old is not None:
            os.replace(old, final_dir)
        raise
    _fsync_directory(final_dir.parent)
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


@contextlib.contextmanager
def staged_directory(final_dir: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty hidden sibling of `final_dir` to write into; swap it in on success.

    On an exception the staging directory is removed and `final_dir` is left as it was.
    """
    final_dir = Path(final_dir)
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = _sibling(final_dir, "tmp")
    staging.mkdir(mode=0o777)  # honours the umask, unlike tempfile.mkdtemp's 0o700
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        replace_directory(staging, final_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
