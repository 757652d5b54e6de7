"""The worker side of data/: a rank's slices of the epoch's global batches, read by the rank.

Every corpus is trained from indexed shards (data/indexed_shards.py, built once by
data/token_cache.py), and a Train worker makes one object, `RankBatches(source, plan, rank,
world)`, that reads its own rows from them: no other process touches them, and no actor hands
them out.

A rank works out everything from (the index, the plan, the position):
- the epoch's order is `ShardOrder(shard sizes, seed, epoch)` (data/shuffle.py; only the
  corpus's row count counts, not its cut into shards), a function
  every rank computes alike;
- global batch k is the rows at epoch positions [k·G, (k+1)·G) of that order, the same for
  any number of workers W; with length grouping (`data.length_group_batches` = k > 1) a pool
  of k·G positions is sorted by the rows' lengths (the shards' `_length` column, 4 bytes a
  row) and cut into k batches visited in an order drawn from the seed
  (data/epoch_plan.py `length_groups`, `EpochOrder.pool_batches`);
- rank r takes rows split_rows(G, W, r) of each batch (⌊G/W⌋ or ⌈G/W⌉) and reads only those
  from the memory-mapped shards.
A position is `DataPosition(epoch, rows=positions before the pool, pool_batches=batches of
the pool done)`: resuming costs one window of the order, wherever in a shard it falls.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from distributed_emb.data.epoch_plan import (
    BatchPlan,
    DataPosition,
    EpochOrder,
    length_groups,
    split_rows,
)
from distributed_emb.data.indexed_shards import LENGTH, ShardIndex, ShardReader
from distributed_emb.data.shuffle import SPAN_ROWS, WINDOW_ROWS, ShardOrder

AHEAD = 4  # chunks a rank's reading thread prepares beyond the one being trained
CHUNK_ROWS = 2048  # rows of this rank's slices read by one take (fewer, larger reads)


@dataclass(frozen=True)
class IndexedSource:
    """The indexed shards every rank reads from itself (what a TrainingStream carries)."""

    index: ShardIndex
    cache_dir: str | None = None  # node-local copies of remote shards (None: the temp dir)
    span_rows: int = SPAN_ROWS  # the order's parameters (data/shuffle.py)
    window_rows: int = WINDOW_ROWS

    @property
    def fingerprint(self) -> str:
        """The shards and the order's parameters (the seed and the cut are the plan's)."""
        return f"indexed:{self.index.fingerprint}:{self.span_rows}:{self.window_rows}"

    def order(self, seed: int | None, epoch: int) -> ShardOrder:
        return ShardOrder(self.index.shard_rows, seed, epoch, self.span_rows, self.window_rows)


class RankBatches:
    """A rank's slices of an indexed corpus's global batches (see the module docstring)."""

    def __init__(self, source: IndexedSource, plan: BatchPlan, rank: int, world_size: int):
        self.source = source
        self.plan = plan
        self.rank = rank
        self.world = world_size
        self.reader = ShardReader(source.index, source.cache_dir)

    def batches(self, start: DataPosition) -> Iterator[tuple[np.ndarray, DataPosition]]:
        """(this rank's global row numbers of each global batch, position after it) from
        `start` to the end of the epoch; nothing read but lengths for grouping."""
        plan = self.plan
        order = self.source.order(plan.seed, start.epoch)
        batch_order = EpochOrder(plan.seed, start.epoch)  # a pool's batch order
        begin, end = split_rows(plan.global_batch, self.world, self.rank)
        pool_rows = plan.global_batch * plan.length_group
        pool_start, skip = start.rows, start.pool_batches
        while pool_start + plan.global_batch <= order.total:
            pool_stop = min(pool_start + pool_rows, order.total)
            count = (pool_stop - pool_start) // plan.global_batch
            rows = order.rows(pool_start, pool_start + count * plan.global_batch)
            if plan.length_group > 1:
                lengths = self.reader.take(rows, columns=[LENGTH]).column(LENGTH).to_numpy()
                visit = batch_order.pool_batches(pool_start, count)
                batches = rows[length_groups(lengths, plan.global_batch, visit)]  # (count, G)
            else:
                batches = rows.reshape(count, plan.global_batch)
            for index in range(skip, count):
                if index == count - 1:
                    after = DataPosition(start.epoch, rows=pool_start + count * plan.global_batch)
                else:
                    after = DataPosition(start.epoch, rows=pool_start, pool_batches=index + 1)
                yield batches[index, begin:end], after
            pool_start, skip = pool_stop, 0

    def epoch(self, start: DataPosition) -> Iterator[tuple[pa.Table, DataPosition]]:
        """This rank's slices from `start` to the end of the epoch, each with the position
        after its global batch; read a few chunks ahead by a thread of this process."""
        begin, end = split_rows(self.plan.global_batch, self.world, self.rank)
        # Global batches read by one take: fewer, larger calls.
        chunk = max(1, CHUNK_ROWS // max(1, end - begin))
        ready: queue.Queue = queue.Queue(maxsize=AHEAD)
        stop = threading.Event()

        def read() -> None:
            try:
                pending: list = []
                for item in self.batches(start):
                    pending.append(item)
                    if len(pending) == chunk:
                        if not _hand_over(ready, stop, self._read(pending)):
                            return
                        pending = []
                if pending:
                    _hand_over(ready, stop, self._read(pending))
                _hand_over(ready, stop, None)
            except BaseException as error:  # raised in the rank's thread, which fails the run
                _hand_over(ready, stop, error)

        thread = threading.Thread(target=read, daemon=True, name=f"rank{self.rank}-reader")
        thread.start()
        try:
            while True:
                item = ready.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield from item
        finally:
            stop.set()

    def _read(self, batches: list) -> list[tuple[pa.Table, DataPosition]]:
        table = self.reader.take(np.concatenate([rows for rows, _ in batches]))
        out, offset = [], 0
        for rows, position in batches:
            out.append((table.slice(offset, len(rows)).drop_columns(_extra(table)), position))
            offset += len(rows)
        return out


def _extra(table: pa.Table) -> list[str]:
    return [LENGTH] if LENGTH in table.column_names else []


def _hand_over(ready: queue.Queue, stop: threading.Event, item) -> bool:
    """Put `item` for the rank's thread unless it stopped listening. False: it did."""
    while not stop.is_set():
        try:
            ready.put(item, timeout=0.5)
            return True
        except queue.Full:
            continue
    return False
