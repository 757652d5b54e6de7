"""Writing the embedding output directory (its reading side is shard_layout.py).

    OUT/embedding_settings.json              what decides each shard's content (model, corpus,
                                             block size, precision...): written before the
                                             first shard, compared on every later run
    OUT/shards/part-<first_id:012d>.parquet  one finished corpus block: id (int64), embedding
                                             (fixed_size_list of float32, int8, or uint8 bits
                                             for ubinary), text (optional); sorted by id
    OUT/calibration.npy                      int8 only: the (2, d) per-dimension [min, max]
                                             that quantised every shard (and must quantise
                                             the queries)
    OUT/manifest.json                        written last: the shards, their rows, the drops

`first_id` is the id of the block's first line (data/readers.py `row_id`), kept or not: the
reader fixes it from the file alone, so the name is known before the block is read, and every
id in the shard lies between it and the next block's. A shard is written whole or not at all
(a temporary name, then a rename; one PUT on object storage), so a present shard is a
finished block. Local paths and s3:// or gs:// URIs alike, through pyarrow.fs.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from distributed_emb.storage import (
    filesystem_of,
    is_remote,
    join,
    read_bytes,
    read_text,
    write_bytes,
    write_text,
)
from distributed_emb.vectors.shard_layout import CALIBRATION

SHARDS = "shards"
SETTINGS = "embedding_settings.json"

_SHARD_NAME = re.compile(r"part-(\d+)\.parquet")
_TEMPORARY = ".tmp-"  # atomic_files: a write in progress is ".<name>.tmp-<hex>"


def shard_name(first_id: int) -> str:
    return f"part-{first_id:012d}.parquet"


def shard_location(out: str, first_id: int) -> str:
    return join(out, SHARDS, shard_name(first_id))


def finished_shards(out: str) -> set[int]:
    """The first ids of the shards present in `out` (each a finished block)."""
    filesystem, path = filesystem_of(join(out, SHARDS))
    found = filesystem.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    names = (_SHARD_NAME.fullmatch(info.base_name) for info in found)
    return {int(match.group(1)) for match in names if match}


def shard_rows(location: str) -> int | None:
    """The rows of the shard at `location`, read from its footer; None where there is none."""
    filesystem, path = filesystem_of(location)
    if filesystem.get_file_info(path).type != pafs.FileType.File:
        return None
    with filesystem.open_input_file(path) as handle:
        return pq.ParquetFile(handle).metadata.num_rows


def write_shard(table: pa.Table, location: str) -> None:
    """Write `table` as the Parquet file at `location`, whole or not at all
    (storage.write_bytes: a hidden temporary name in the same directory, flushed and renamed
    over the target; on object storage one upload, seen only once complete)."""
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    write_bytes(location, buffer.getvalue())


def remove_unfinished_writes(out: str) -> int:
    """Delete the temporary files that writers killed mid-write left in `out`'s shards;
    returns how many. Only once no writer runs: a live writer's file would go too."""
    if is_remote(out):
        return 0  # an unfinished upload leaves no object behind
    directory = Path(filesystem_of(join(out, SHARDS))[1])
    if not directory.is_dir():
        return 0
    leftovers = [p for p in directory.iterdir() if p.name.startswith(".") and _TEMPORARY in p.name]
    for path in leftovers:
        path.unlink(missing_ok=True)
    return len(leftovers)


def read_json(location: str) -> dict | None:
    """The JSON object at `location`, or None where there is none."""
    text = read_text(location)
    if text is None:
        return None
    tree = json.loads(text)
    if not isinstance(tree, dict):
        raise ValueError(f"{location}: expected a JSON object")
    return tree


def write_json(location: str, tree: dict) -> None:
    write_text(location, json.dumps(tree, indent=2, sort_keys=False) + "\n")


def save_calibration(out: str, ranges: np.ndarray) -> None:
    """`ranges` (2, d): written once, before any int8 shard, and reused by every later run."""
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(ranges, dtype=np.float32))
    write_bytes(join(out, CALIBRATION), buffer.getvalue())


def load_calibration(out: str) -> np.ndarray | None:
    """The saved (2, d) int8 ranges of `out`, or None where there are none."""
    data = read_bytes(join(out, CALIBRATION))
    return None if data is None else np.load(io.BytesIO(data), allow_pickle=False)
