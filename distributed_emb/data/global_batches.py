"""The cut of a run's stream into global batches, and the streamed path's feeder.

`BatchPlan` and `split_rows` are shared by both ways a rank gets its rows: global batch k is
the same G rows for any number of workers W, and rank r takes rows `split_rows(G, W, r)` of
it (⌊G/W⌋ or ⌈G/W⌉ rows, so any W in an elastic range trains the same batch).

For a streamed corpus (data/stream.py, no prepare pass) a run has one `GlobalBatchFeeder`
actor (started by rank 0, on rank 0's node, and gone with it). It reads the epoch's rows once,
in the order of data/epoch_order.py, from wherever the source says (Ray Data tasks on the
cluster's CPUs, or blocks in the object store), cuts them into global batches of exactly
`global_batch` rows and puts each rank's slice in the object store for that rank alone, so
each row is read, cleaned and tokenised once per epoch and crosses the network once more, to
the rank that trains it. Indexed shards need no feeder: each rank reads its own rows
(data/rank_batches.py).

Every batch comes with the `DataPosition` after it; a checkpoint keeps that position (five
integers), and a resumed or resized group asks the feeder for the stream from there.

Length grouping (`data.length_group_batches` = k > 1) happens here too, on global batches:
each pool of k·G rows is sorted by length (token ids when tokenised in Ray Data, else
characters), cut into k global batches of similar length and those are visited in an order
drawn from the seed, so grouping does not depend on W either. A position inside a pool is the
pool's start and how many of its batches were trained.

Why not Ray Data's `streaming_split`: it deals blocks to whichever rank asks first, so the
order depends on timing and W, and a resume would have to remember every row trained.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from distributed_emb.data.data_config import DataConfig
from distributed_emb.data.epoch_order import BLOCK, DataPosition, EpochOrder, places_in_blocks
from distributed_emb.data.tokenize import IDS_SUFFIX

log = logging.getLogger(__name__)

AHEAD = 4  # chunks the feeder prepares beyond the slowest rank
IN_FLIGHT = 2  # requests a rank keeps open (its prefetch)
CHUNK_ROWS = 2048  # rows of a rank's share of one chunk of global batches


@dataclass(frozen=True)
class BatchPlan:
    """How the stream is cut, the same for every W."""

    global_batch: int
    seed: int | None
    length_group: int = 1  # global batches per length-sorted pool (1: no grouping)
    length_columns: tuple[str, ...] = ("text",)
    max_rows: int | None = None  # clean rows per epoch (data.max_rows)


def batch_plan(data: DataConfig, global_batch: int) -> BatchPlan:
    """The cut of a run's stream: `global_batch` (train.global_batch) and the data section's
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


def length_of_rows(table: pa.Table, columns: tuple[str, ...]) -> np.ndarray:
    """(n,) a row's length for grouping: token ids where tokenised, else characters; pairs: the
    longer side."""
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


def global_batches(
    tables: Iterator[pa.Table], plan: BatchPlan, start: DataPosition
) -> Iterator[tuple[pa.Table, DataPosition]]:
    """(global batch, position after it) in order, from `start`: the single-process reference
    of what the feeder serves (the feeder runs exactly this)."""
    order = EpochOrder(plan.seed, start.epoch)
    pool_rows = plan.global_batch * plan.length_group
    pending: list[pa.Table] = []
    pending_rows = 0
    last_key, last_count = None, 0  # the block the rows so far ended in, and its rows so far
    taken = start.rows  # clean rows of the epoch before the pending ones
    skip_batches = start.pool_batches
    for table in tables:
        keys = table.column(BLOCK).to_numpy()
        places = places_in_blocks(keys, last_key, last_count)
        if len(keys):
            last_key = int(keys[-1])
            last_count = int(places[-1]) + 1
        # Rows before the start position (a resumed epoch reads its first block whole).
        keep = (keys > start.block) | ((keys == start.block) & (places >= start.offset))
        if not keep.all():
            table, keys, places = table.filter(pa.array(keep)), keys[keep], places[keep]
        if plan.max_rows is not None:
            room = plan.max_rows - taken - pending_rows
            if room <= 0:
                break
            table, keys, places = table.slice(0, room), keys[:room], places[:room]
        table = table.append_column("_place", pa.array(places))
        pending.append(table)
        pending_rows += table.num_rows
        # A pool goes once the row after it is known: the position after the pool is that
        # row's, so a pool that ends with its block resumes at the next block, not by
        # re-reading a finished one.
        while pending_rows > pool_rows:
            merged = pa.concat_tables(pending)
            pool, rest = merged.slice(0, pool_rows), merged.slice(pool_rows)
            after = _first_position(rest, start.epoch, taken + pool_rows)
            yield from _pool_batches(pool, plan, order, start.epoch, taken, skip_batches, after)
            skip_batches = 0
            taken += pool_rows
            pending, pending_rows = [rest], rest.num_rows
    # The end of the epoch: a last whole pool; with length grouping, a last shorter pool
    # still gives its whole global batches.
    if pending_rows >= pool_rows or (plan.length_group > 1 and pending_rows >= plan.global_batch):
        merged = pa.concat_tables(pending)
        yield from _pool_batches(merged, plan, order, start.epoch, taken, skip_batches, None)


def _first_position(rows: pa.Table, epoch: int, taken: int) -> DataPosition:
    return DataPosition(
        epoch, int(rows.column(BLOCK)[0].as_py()), int(rows.column("_place")[0].as_py()), taken
    )


def _pool_batches(pool: pa.Table, plan: BatchPlan, order: EpochOrder, epoch: int, taken: int,
                  skip_batches: int, after: DataPosition | None):  # fmt: skip
    """A pool's global batches (one without grouping), each with the position after it:
    inside the pool, its start and the batches done; after its last batch, `after` (the next
    row's), or at the end of the epoch just past the pool's last row."""
    keys, places = pool.column(BLOCK), pool.column("_place")
    first = (int(keys[0].as_py()), int(places[0].as_py()))
    last = (int(keys[-1].as_py()), int(places[-1].as_py()))
    count = pool.num_rows // plan.global_batch
    if plan.length_group > 1:
        lengths = length_of_rows(pool, plan.length_columns)
        groups = length_groups(lengths, plan.global_batch, order.pool_batches(taken, count))
        pool = pool.take(pa.array(groups.reshape(-1)))
    pool = pool.drop_columns([BLOCK, "_place"])
    end = after or DataPosition(epoch, last[0], last[1] + 1, taken + pool.num_rows)
    for index in range(skip_batches, count):
        batch = pool.slice(index * plan.global_batch, plan.global_batch)
        if index == count - 1:
            yield batch, end
        else:
            yield batch, DataPosition(epoch, first[0], first[1], taken, index + 1)


class GlobalBatchFeeder:
    """The actor (see the module docstring). Ranks call `take`; one producer thread per
    stream start fills a bounded buffer of chunks: `chunk` consecutive global batches, each
    rank's slices of them put as one object (one put and one request per rank and chunk,
    not per batch: at small slices the per-object cost is what limits the rate)."""

    def __init__(self, source, plan: BatchPlan, world_size: int, chunk_rows: int = CHUNK_ROWS):
        self.source = source
        self.plan = plan
        self.world = world_size
        self.chunk = chunk_batches(plan.global_batch, world_size, chunk_rows)
        self.lock = threading.Condition()
        self.streams: dict[tuple, _Stream] = {}

    def take(self, start: dict, index: int, rank: int):
        """(ObjectRef of rank's slices of chunk `index` of the stream from `start`, as one
        table, and the position after each of its global batches, as dicts), or (None, None)
        past the end of the epoch."""
        key = tuple(sorted(start.items()))
        with self.lock:
            stream = self.streams.get(key)
            if stream is None:
                stream = self._start(key, DataPosition.from_dict(start))
            while True:
                if stream.error is not None:
                    raise stream.error
                if index in stream.ready:
                    refs, positions = stream.ready[index]
                    ref, refs[rank] = refs[rank], None
                    if all(r is None for r in refs):
                        del stream.ready[index]
                        self.lock.notify_all()
                    return ref, [p.as_dict() for p in positions]
                if stream.done and index >= stream.count:
                    return None, None
                self.lock.wait()

    def _start(self, key: tuple, start: DataPosition) -> _Stream:
        # Ranks move in lock step: at most the previous stream still gets late requests.
        for old in list(self.streams)[:-1]:
            self.streams.pop(old).stop = True
        stream = self.streams[key] = _Stream()
        thread = threading.Thread(target=self._produce, args=(stream, start), daemon=True)
        thread.start()
        return stream

    def _produce(self, stream: _Stream, start: DataPosition) -> None:
        try:
            order = EpochOrder(self.plan.seed, start.epoch)
            tables = self.source.epoch_tables(order, start)
            batches, positions = [], []
            for batch, position in global_batches(tables, self.plan, start):
                batches.append(batch)
                positions.append(position)
                if len(batches) == self.chunk and not self._put(stream, batches, positions):
                    return
                if len(batches) == self.chunk:
                    batches, positions = [], []
            if batches and not self._put(stream, batches, positions):
                return
        except BaseException as error:  # handed to the ranks, which fail the run with it
            log.exception("the data stream failed")
            with self.lock:
                stream.error = error
        with self.lock:
            stream.done = True
            self.lock.notify_all()

    def _put(self, stream: _Stream, batches: list, positions: list) -> bool:
        """Put each rank's slices of `batches` as one object; wait for room in the buffer.
        False: the stream was dropped."""
        import ray  # startup

        refs = []
        for rank in range(self.world):
            begin, end = split_rows(self.plan.global_batch, self.world, rank)
            refs.append(ray.put(pa.concat_tables([b.slice(begin, end - begin) for b in batches])))
        with self.lock:
            while len(stream.ready) >= AHEAD and not stream.stop:
                self.lock.wait()
            if stream.stop:
                return False
            stream.ready[stream.count] = (refs, positions)
            stream.count += 1
            self.lock.notify_all()
        return True


def chunk_batches(global_batch: int, world_size: int, chunk_rows: int = CHUNK_ROWS) -> int:
    """Global batches per chunk: enough that each rank's object holds ~`chunk_rows` rows (at
    most: sized by the largest slice, rank 0's)."""
    start, stop = split_rows(global_batch, world_size, 0)
    return max(1, chunk_rows // max(1, stop - start))


class _Stream:
    def __init__(self):
        self.ready: dict[int, tuple[list, DataPosition]] = {}
        self.count = 0  # chunks produced
        self.done = False
        self.stop = False
        self.error: BaseException | None = None


class RankStream:
    """A rank's view of the run's feeder: its slices of every global batch, in order."""

    def __init__(self, feeder, rank: int):
        self.feeder = feeder
        self.rank = rank

    @classmethod
    def connect(cls, source, plan: BatchPlan, rank: int, world_size: int):
        """Collective: rank 0 starts the feeder on its node, the others find it by name."""
        import ray  # startup
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from distributed_emb import distributed

        name, feeder = None, None
        if rank == 0:
            name = f"feeder-{uuid.uuid4().hex[:12]}"
            here = ray.get_runtime_context().get_node_id()
            # Hard affinity: Ray places an actor that asks for no resources on a random node
            # whatever a soft affinity says (Ray 2.60 picked another node each time it was
            # tried), and a feeder there ties this run to a node it does not train on, so
            # losing that node restarts a run that lost nothing
            # (tests/cluster/test_node_loss.py). Rank 0's node is alive while rank 0 runs here.
            feeder = (
                ray.remote(GlobalBatchFeeder)
                .options(
                    name=name,
                    num_cpus=0,
                    max_concurrency=IN_FLIGHT * world_size + 4,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
                )
                .remote(source, plan, world_size)
            )
            ray.get(feeder.__ray_ready__.remote())  # registered under its name before lookups
        name = distributed.broadcast_object(name)
        # Rank 0 keeps the creating handle: the actor lives as long as it does.
        return cls(feeder if rank == 0 else ray.get_actor(name), rank)

    def epoch(self, start: DataPosition) -> Iterator[tuple[pa.Table, DataPosition]]:
        """This rank's slices from `start` to the end of the epoch, each with the position
        after its global batch."""
        import ray  # startup

        start_dict = start.as_dict()
        asked = [self.feeder.take.remote(start_dict, k, self.rank) for k in range(IN_FLIGHT)]
        index = IN_FLIGHT
        while True:
            ref, positions = ray.get(asked.pop(0))
            if ref is None:
                return
            asked.append(self.feeder.take.remote(start_dict, index, self.rank))
            index += 1
            rows = ray.get(ref)
            # Every global batch of the chunk gives this rank the same split_rows slice, so the
            # division is exact even where the ranks' slices differ (⌊G/W⌋ or ⌈G/W⌉ rows).
            share = rows.num_rows // len(positions)
            for k, position in enumerate(positions):
                yield rows.slice(k * share, share), DataPosition.from_dict(position)
