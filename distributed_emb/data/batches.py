"""What a rank does with its slice of a global batch (data/rank_batches.py): Arrow rows of token
ids → the arrays the collator takes (`numpy_batch`), and `output.row_log`'s record of the rows
each rank trained (`TrainedRowLog`).

Here rather than in the collator: both work on the rows as the shards hold them, before any
tensor exists, and the row log is what tests compare a run's batches with
(tests/harness/row_log.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa

NO_TOKEN = -1  # fills a token-id matrix past each row's end (see numpy_batch)


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
