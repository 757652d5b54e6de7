"""An epoch's order of rows, as a function of the seed, the epoch and the corpus alone, and a
position in it that fits in a few integers.

The corpus is a list of *units* (files, or the blocks of a dataset already in the object
store), each read as a sequence of *source blocks* whose bounds depend only on the unit
(`data.block_rows` lines of a text file, a Parquet file's record batches). An epoch:

1. visits the units in a permutation drawn from (seed, epoch);
2. reads each unit's blocks in order (a stream cannot jump inside a gzip file);
3. shuffles each block's rows with a permutation drawn from (seed, epoch, unit, block).

Nothing in it depends on how many workers train, how Ray cuts the stream into its own blocks
or which task read what: the stream of clean rows is the same for 1 or 64 workers, and the
global batches cut from it (data/global_batches.py) are too. `shuffle_seed` None keeps file
order with no shuffling.

Every row carries `_block`, its source block's key (`unit ordinal in the epoch << 32 | block
in unit`), so a consumer always knows where in the order it is. `DataPosition` is what a
checkpoint keeps: the key of the block the next row comes from, how many of that block's clean
rows were already taken, and counters. A resumed stream starts reading at that unit and block
(earlier units are not opened; earlier blocks of the same unit are read but not parsed) and
drops the block's first `offset` clean rows: the cost of resuming does not grow with how far
into the epoch the run was.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa

BLOCK = "_block"  # int64: unit ordinal in the epoch's order << BLOCK_BITS | block in unit
BLOCK_BITS = 32
SEQUENCE = "_seq"  # int32: a row's place in its block (only where something reorders rows)


def block_key(unit_ordinal: int, block_in_unit: int) -> int:
    return (unit_ordinal << BLOCK_BITS) | block_in_unit


def split_block_key(key: int) -> tuple[int, int]:
    return key >> BLOCK_BITS, key & ((1 << BLOCK_BITS) - 1)


@dataclass(frozen=True)
class DataPosition:
    """Where the next global batch of an epoch starts, in the epoch's order.

    `block`, `offset`: the source block (key) the pool's first row comes from and how many of
    its clean rows come before it. `rows`: clean rows taken this epoch before it (what
    `data.max_rows` counts). `pool_batches`: global batches of the current length-grouped pool
    already trained (0 without length grouping). Five integers, whatever the corpus size."""

    epoch: int = 0
    block: int = 0
    offset: int = 0
    rows: int = 0
    pool_batches: int = 0

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict | None) -> DataPosition:
        return cls(**values) if values else cls()


@dataclass(frozen=True)
class EpochOrder:
    """The order of one epoch over `units` units (see the module docstring)."""

    seed: int | None
    epoch: int

    @property
    def shuffled(self) -> bool:
        return self.seed is not None

    def units(self, count: int) -> np.ndarray:
        """Unit indices in the order this epoch visits them."""
        if not self.shuffled:
            return np.arange(count)
        return np.random.default_rng([self.seed, self.epoch, 0]).permutation(count)

    def rows_of_block(self, unit: int, block: int, rows: int) -> np.ndarray | None:
        """The order of a source block's rows (None: as read). `unit`: the unit's own index
        (not its ordinal this epoch), so a block is shuffled the same way wherever it falls."""
        if not self.shuffled:
            return None
        return np.random.default_rng([self.seed, self.epoch, 1, unit, block]).permutation(rows)

    def pool_batches(self, pool_start_rows: int, count: int) -> np.ndarray:
        """The order of a length-grouped pool's batches (by length otherwise: short ones
        first), drawn from where the pool starts in the epoch."""
        if not self.shuffled:
            return np.arange(count)
        return np.random.default_rng([self.seed, self.epoch, 2, pool_start_rows]).permutation(count)


def read_plan(order: EpochOrder | None, units: int, start_block: int = 0) -> list[tuple]:
    """(unit index, its ordinal this epoch, source blocks to skip in it) for every unit the
    epoch still reads from `start_block` on; `order` None: every unit, in listing order."""
    if order is None:
        return [(unit, unit, 0) for unit in range(units)]
    first_unit, first_block = split_block_key(start_block)
    return [
        (int(unit), ordinal, first_block if ordinal == first_unit else 0)
        for ordinal, unit in enumerate(order.units(units))
        if ordinal >= first_unit
    ]


def places_in_blocks(keys: np.ndarray, last_key: int | None, last_count: int) -> np.ndarray:
    """For rows in stream order with block keys `keys` (non-decreasing), each row's index
    among its block's rows; `last_key`/`last_count`: the block the previous rows ended in and
    how many of its rows they held."""
    if len(keys) == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.empty(len(keys), dtype=bool)
    starts[0] = True
    starts[1:] = keys[1:] != keys[:-1]
    run_starts = np.flatnonzero(starts)
    places = np.arange(len(keys)) - run_starts[np.cumsum(starts) - 1]
    if last_key is not None and keys[0] == last_key:
        places[: run_starts[1] if len(run_starts) > 1 else len(keys)] += last_count
    return places.astype(np.int64)


def ordered_block(
    table: pa.Table,
    order: EpochOrder,
    unit: int,
    unit_ordinal: int,
    block: int,
    with_sequence: bool = False,
) -> pa.Table:
    """A source block's rows in the epoch's order, tagged with the block's key (and each
    row's place in it, `with_sequence`)."""
    permutation = order.rows_of_block(unit, block, table.num_rows)
    if permutation is not None:
        table = table.take(pa.array(permutation))
    key = np.full(table.num_rows, block_key(unit_ordinal, block), dtype=np.int64)
    table = table.append_column(BLOCK, pa.array(key))
    if with_sequence:
        table = table.append_column(SEQUENCE, pa.array(np.arange(table.num_rows, dtype=np.int32)))
    return table
