"""The places a run writes to (output.dir, output.storage_path, data.token_cache_dir), checked
before Ray starts: a local directory that cannot be made, or a URI whose filesystem pyarrow
cannot resolve, fails here as one line naming the key, not in a Train worker after the cluster
has started. Nothing is created: a `--plan` or a refused run leaves no directories behind, and
no bucket is ever made (storage.require_reachable only asks that it exists)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from distributed_emb.checks import ConfigError
from distributed_emb.storage import is_remote, require_reachable


def require_writable(location: str | None, key: str) -> None:
    """`location` (the value of setting `key`; None: unset) is a directory this process can
    make or write in, or a URI on a filesystem pyarrow knows whose bucket exists. Raises
    ConfigError `key: location: why`."""
    if location is None:
        return
    try:
        if not is_remote(location):
            problem = _local_problem(Path(location).expanduser())
        elif location.startswith("file://"):  # a local path as a URI: it has no bucket
            problem = _local_problem(Path(pafs.FileSystem.from_uri(location)[1]))
        else:
            require_reachable(location, key)  # raises its own line for a missing bucket
            problem = None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as error:
        # From resolving the URI (an unknown scheme, a filesystem this pyarrow lacks): the
        # first line says which; the rest (e.g. every libjvm path tried for hdfs://) does not.
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        problem = f"cannot resolve its filesystem ({reason})"
    if problem:
        raise ConfigError(f"{key}: {location}: {problem}")


def _local_problem(path: Path) -> str | None:
    """Why `path` cannot be a directory this process writes in, or None. The nearest part of it
    that exists decides: a directory we may write in (a new directory can be made there), or
    a file (nothing can be made under it)."""
    path = path.absolute()
    try:
        existing = next(p for p in (path, *path.parents) if p.exists())
    except OSError as error:  # a parent we may not even look into
        return f"cannot be checked ({error.strerror or error})"
    if not existing.is_dir():
        if existing == path:
            return "is a file, not a directory"
        return f"{existing} is a file, not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        if existing == path:
            return "is not writable"
        return f"cannot be created: {existing} is not writable"
    return None
