"""Copies of a run's results onto its storage path (s3://, gs://, or a shared directory).

Ray Train already keeps checkpoints there; the exported model and metrics.json are written on
the driver first (where the job runs) and copied next to the checkpoints, so everything a run
produced outlives the node that ran it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow.fs as pafs

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
