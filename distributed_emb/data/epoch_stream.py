"""One worker's epoch: its shard's rows as batches of exactly B rows, minus rows already trained.

A Train worker pulls Arrow batches from its shard iterator (data/sharding.py), shuffled in a
seeded buffer, and cuts them into batches of exactly `batch_size` rows (or pools of k·B rows
for length grouping). After a restart mid-epoch, the rows this rank trained on before the
checkpoint (`skip`) are left out, so within an epoch no row is trained twice and none is
skipped apart from the steps rolled back to the checkpoint.

The row ids a rank trained on in the current epoch are saved with every checkpoint as a
NumPy array (no pickle: loaded with allow_pickle=False).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from distributed_emb.data.readers import ROW_ID

CONSUMED_FILE = "rank{rank}_epoch_rows.npy"
# Rows per batch asked of Ray Data. Each of its batches costs a fixed amount in the consumer
# (a draw from the shuffle buffer, format conversion); cutting training batches from larger
# ones pays it once per many batches (docs/BENCHMARKS.md, tokenising data path).
FETCH_ROWS = 1024
NO_TOKEN = -1  # fills a token-id matrix past each row's end (see numpy_batch)


def epoch_batches(
    shard,
    batch_size: int,
    shuffle_buffer_rows: int | None,
    seed: int,
    skip: np.ndarray | None = None,
    last_at_least: int | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """Batches of exactly `batch_size` rows as {column: array}; a last partial batch is dropped
    (every rank needs full batches for the gathered negatives), unless it holds at least
    `last_at_least` rows: a length-grouped pool of k·B rows is cut into whole batches of B by
    the collator, so its last, shorter pool still gives batches."""
    pending: list[pa.Table] = []
    pending_rows = 0
    skip_ids = pa.array(skip, pa.int64()) if skip is not None and len(skip) else None
    fetch = max(batch_size, FETCH_ROWS)
    if shuffle_buffer_rows:  # Ray draws each batch from a buffer at least that large
        fetch = max(batch_size, min(fetch, shuffle_buffer_rows))
    for table in shard.iter_batches(
        batch_size=fetch,
        batch_format="pyarrow",
        prefetch_batches=2,
        local_shuffle_buffer_size=shuffle_buffer_rows or None,
        local_shuffle_seed=seed if shuffle_buffer_rows else None,
    ):
        if skip_ids is not None:
            table = table.filter(pc.invert(pc.is_in(table.column(ROW_ID), skip_ids)))
        pending.append(table)
        pending_rows += table.num_rows
        while pending_rows >= batch_size:
            merged = pa.concat_tables(pending)
            yield numpy_batch(merged.slice(0, batch_size))
            rest = merged.slice(batch_size)
            pending, pending_rows = [rest], rest.num_rows
    if last_at_least is not None and pending_rows >= last_at_least:
        yield numpy_batch(pa.concat_tables(pending))


def numpy_batch(table: pa.Table) -> dict[str, np.ndarray]:
    """{column: array}; a column of token-id lists (data/tokenize.py) becomes one (n, longest)
    int32 matrix, each row's ids from the left and NO_TOKEN after them, built from the Arrow
    offsets at once rather than one small array per row."""
    out = {}
    for name in table.column_names:
        column = table.column(name)
        if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            out[name] = _id_matrix(column.combine_chunks())
        else:
            out[name] = column.to_numpy(zero_copy_only=False)
    return out


def _id_matrix(lists: pa.ListArray) -> np.ndarray:
    lengths = np.diff(lists.offsets.to_numpy())  # (n,)
    width = int(lengths.max()) if len(lengths) else 0
    matrix = np.full((len(lengths), width), NO_TOKEN, dtype=np.int32)  # (n, longest)
    matrix[np.arange(width) < lengths[:, None]] = lists.flatten().to_numpy()
    return matrix


def save_epoch_rows(directory: str, rank: int, row_ids: list[np.ndarray]) -> None:
    ids = np.unique(np.concatenate(row_ids)) if row_ids else np.zeros(0, dtype=np.int64)
    np.save(Path(directory) / CONSUMED_FILE.format(rank=rank), ids.astype(np.int64))


def load_epoch_rows(directory: str) -> np.ndarray:
    """The row ids every rank had trained on in the checkpoint's epoch (their union)."""
    parts = [
        np.load(path, allow_pickle=False)
        for path in sorted(Path(directory).glob(CONSUMED_FILE.format(rank="*")))
    ]
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)


class TrainedRowLog:
    """`output.row_log`: which rows each rank trained on, batch by batch, in a JSONL file per
    rank (appended across restarts; `attempt` tells the runs apart)."""

    def __init__(self, output_dir: str, rank: int):
        self.path = Path(output_dir) / "trained_rows" / f"rank{rank}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, state, row_ids: np.ndarray) -> None:
        record = {
            "attempt": state.restarts,
            "epoch": state.epoch,
            "step": state.step + 1,  # the optimizer step this batch counts towards
            "rows": [int(r) for r in row_ids],
        }
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
