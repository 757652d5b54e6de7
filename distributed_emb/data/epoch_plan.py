"""How an epoch of indexed shards is cut into global batches, the same for any number of workers,
and the few integers a checkpoint keeps to resume it.

Pure functions of the settings, the seed and the epoch: every rank computes them alike
(data/rank_batches.py), so no process has to hand out rows or tell the others where the
stream is.

- `BatchPlan` (`batch_plan`): the global batch G, the seed, the length grouping. Global batch k
  is the same G rows for any W; rank r trains rows `split_rows(G, W, r)` of it (⌊G/W⌋ or
  ⌈G/W⌉ rows: the first G % W ranks take one more), so any W of an elastic range trains the
  same batches and a group resized mid-epoch goes on with exactly the rest.
- Length grouping (`data.length_group_batches` = k > 1): each pool of k·G rows of the epoch's
  order is sorted by length (`length_of_rows`, stored beside the ids as `_length` when the
  shards are built) and cut into k batches of similar length (`length_groups`), visited in
  an order drawn from (seed, epoch, where the pool starts) (`EpochOrder.pool_batches`).
- `DataPosition`: where the next global batch starts, three integers whatever the corpus
  size: what `trainer_state.json` keeps and a resumed or resized group starts from.

The order of the rows themselves (spans of the whole corpus permuted, rows shuffled within
windows) is data/shuffle.py's `ShardOrder`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from distributed_emb.data.data_config import DataConfig
from distributed_emb.data.tokenize import IDS_SUFFIX


@dataclass(frozen=True)
class BatchPlan:
    """How the epoch is cut, the same for every W."""

    global_batch: int
    seed: int | None
    length_group: int = 1  # global batches per length-sorted pool (1: no grouping)
    length_columns: tuple[str, ...] = ("text",)
    max_rows: int | None = None  # data.max_rows (the shards hold at most that many rows)


def batch_plan(data: DataConfig, global_batch: int) -> BatchPlan:
    """The cut of a run's epochs: `global_batch` (train.global_batch) and the data section's
    order settings."""
    from distributed_emb.data.corpus import corpus_columns

    return BatchPlan(
        global_batch=global_batch,
        seed=data.shuffle_seed,
        length_group=max(1, data.length_group_batches),
        length_columns=tuple(corpus_columns(data)),
        max_rows=data.max_rows,
    )


def split_rows(global_batch: int, world_size: int, rank: int) -> tuple[int, int]:
    """Rank r's contiguous rows [start, stop) of a global batch of G rows over W ranks: the
    first G % W ranks take ⌈G/W⌉ rows, the others ⌊G/W⌋ (numpy.array_split's split), so any
    W in an elastic range trains the same G. Rank 0 holds the largest slice."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not one of {world_size} ranks")
    share, extra = divmod(global_batch, world_size)
    start = rank * share + min(rank, extra)
    return start, start + share + (1 if rank < extra else 0)


@dataclass(frozen=True)
class DataPosition:
    """Where the next global batch of an epoch starts: `rows` positions of the epoch's order
    before the current pool, and `pool_batches` global batches of that pool already trained
    (0 without length grouping)."""

    epoch: int = 0
    rows: int = 0
    pool_batches: int = 0

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict | None) -> DataPosition:
        # Checkpoints written before there was one data path also hold `block` and `offset`
        # (always 0 for indexed shards): not part of a position any more.
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (values or {}).items() if k in known})


@dataclass(frozen=True)
class EpochOrder:
    """The seeded draws of one epoch beyond the row order: the order a length-grouped pool's
    batches are visited in."""

    seed: int | None
    epoch: int

    def pool_batches(self, pool_start_rows: int, count: int) -> np.ndarray:
        """The order of a length-grouped pool's batches (unshuffled: short ones first), drawn
        from where the pool starts in the epoch."""
        if self.seed is None:
            return np.arange(count)
        return np.random.default_rng([self.seed, self.epoch, 2, pool_start_rows]).permutation(count)


def length_of_rows(table: pa.Table, columns: tuple[str, ...]) -> np.ndarray:
    """(n,) a row's length for grouping: token ids where tokenised, else characters; pairs and
    rows with a hard negative: the longest of its texts."""
    lengths = []
    for column in columns:
        if column + IDS_SUFFIX in table.column_names:
            values = pc.list_value_length(table.column(column + IDS_SUFFIX))
        else:
            values = pc.utf8_length(table.column(column))
        lengths.append(values.to_numpy(zero_copy_only=False))
    return np.max(lengths, axis=0)


def length_groups(lengths: np.ndarray, batch_rows: int, visit: np.ndarray) -> np.ndarray:
    """(k, batch_rows) row indices: the rows sorted by length (stable), cut into k = n //
    batch_rows batches (the longest remainder left out), visited in the order `visit` (a
    permutation of k). Similar lengths in a batch: far less padding (docs/BENCHMARKS.md)."""
    count = len(lengths) // batch_rows
    by_length = np.argsort(lengths, kind="stable")[: count * batch_rows]
    return by_length.reshape(count, batch_rows)[visit]
