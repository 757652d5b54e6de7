"""Ranks reading their own rows from indexed shards (data/rank_batches.py, data/indexed_shards.py,
cut as data/epoch_plan.py says): the same global batches for any W, divisor of G or not, across
a resize mid-epoch, with length grouping, past many read chunks; a position of a few integers
that resumes the same sequence after any batch; each row read once by the rank that trains it;
a resume deep in a shard; a position refused on a changed index. No Ray: the shards are written
here."""

import json

import numpy as np
import pyarrow as pa
import pytest

from distributed_emb.data import rank_batches
from distributed_emb.data.epoch_plan import BatchPlan, DataPosition, EpochOrder, split_rows
from distributed_emb.data.indexed_shards import (
    LENGTH,
    ShardIndex,
    ShardIndexError,
    ShardReader,
    write_shard,
)
from distributed_emb.data.rank_batches import IndexedSource, RankBatches
from distributed_emb.data.readers import ROW_ID
from distributed_emb.data.training_stream import (
    StreamChangedError,
    TrainingStream,
    check_same_stream,
)

SHARD_SIZES = (37, 120, 5, 64, 90, 1, 83)  # 400 rows, uneven, one shard shorter than a span
SPAN, WINDOW = 8, 48  # small, so the corpus has many spans and several windows


def _write_shards(directory, sizes=SHARD_SIZES) -> ShardIndex:
    """Shards whose rows are their global numbers (`_row_id` = g) with a length per row."""
    start = 0
    for number, size in enumerate(sizes):
        ids = np.arange(start, start + size, dtype=np.int64)
        lengths = (ids * 7919) % 31 + 1  # varied, deterministic
        table = pa.table(
            {
                ROW_ID: ids,
                "text__ids": [[1] * int(n) for n in lengths],
                LENGTH: lengths.astype("int32"),
            }
        )
        write_shard(table, str(directory / f"shard-{number:03d}.arrow"))
        start += size
    return ShardIndex.scan(str(directory))


@pytest.fixture
def source(tmp_path) -> IndexedSource:
    return IndexedSource(_write_shards(tmp_path), span_rows=SPAN, window_rows=WINDOW)


def _epoch(source, plan, world, start=None, stop_after=None):
    """The global batches W ranks train from `start` (each rank's slices concatenated in rank
    order), with the position after each."""
    start = start or DataPosition()
    ranks = [RankBatches(source, plan, r, world).epoch(start) for r in range(world)]
    out = []
    for slices in zip(*ranks):
        rows = np.concatenate([t.column(ROW_ID).to_numpy() for t, _ in slices])
        positions = {p for _, p in slices}
        assert len(positions) == 1  # every rank agrees where the stream is
        out.append((rows, positions.pop()))
        if stop_after is not None and len(out) == stop_after:
            break
    return out


def _reference(source, plan, epoch=0) -> list[np.ndarray]:
    """Plain reference: the epoch's order cut into global batches of G; with length grouping,
    each pool of k·G positions sorted by length (stable) and its batches visited in the seed's
    order."""
    order = source.order(plan.seed, epoch).rows(0, sum(SHARD_SIZES))
    lengths = (order * 7919) % 31 + 1
    batches, pool = [], plan.global_batch * plan.length_group
    for begin in range(0, len(order), pool):
        count = (min(begin + pool, len(order)) - begin) // plan.global_batch
        rows = order[begin : begin + count * plan.global_batch]
        if plan.length_group > 1:
            by_length = rows[np.argsort(lengths[begin : begin + len(rows)], kind="stable")]
            cut = by_length.reshape(count, plan.global_batch)
            visit = EpochOrder(plan.seed, epoch).pool_batches(begin, count)
            batches.extend(cut[visit])
        else:
            batches.extend(rows.reshape(count, plan.global_batch))
    return batches


def test_split_rows_cuts_any_global_batch_as_array_split_does():
    for global_batch in range(1, 41):
        for world in range(1, global_batch + 1):
            spans = [split_rows(global_batch, world, rank) for rank in range(world)]
            sizes = [stop - start for start, stop in spans]
            assert sum(sizes) == global_batch
            assert max(sizes) - min(sizes) <= 1
            assert spans[0][0] == 0 and spans[-1][1] == global_batch
            assert all(spans[r][1] == spans[r + 1][0] for r in range(world - 1))  # contiguous
            expected = [len(part) for part in np.array_split(np.arange(global_batch), world)]
            assert sizes == expected, (global_batch, world)  # the first G % W take one more
    assert [split_rows(12, 5, rank) for rank in range(5)] == [
        (0, 3),
        (3, 6),
        (6, 8),
        (8, 10),
        (10, 12),
    ]
    with pytest.raises(ValueError, match="rank 5 is not one of 5 ranks"):
        split_rows(12, 5, 5)


def test_the_order_is_a_permutation_read_from_the_shards(source):
    order = source.order(5, 0).rows(0, source.index.rows)
    assert sorted(order) == list(range(400))
    reader = ShardReader(source.index)
    table = reader.take(order[:50])
    assert table.column(ROW_ID).to_pylist() == order[:50].tolist()  # in the order asked
    assert reader.rows_taken == 50


@pytest.mark.parametrize("length_group", [1, 3])
def test_any_world_size_trains_the_reference_batches(source, length_group):
    plan = BatchPlan(global_batch=12, seed=7, length_group=length_group)
    expected = _reference(source, plan)
    assert len(expected) == 400 // 12 if length_group == 1 else len(expected) >= 30
    for world in (1, 2, 3, 5):  # 5 does not divide 12: ranks take 3, 3, 2, 2, 2 rows
        got = _epoch(source, plan, world)
        assert [list(rows) for rows, _ in got] == [list(b) for b in expected], world


@pytest.mark.parametrize("length_group", [1, 3])
def test_a_position_resumes_the_same_sequence_after_any_batch(source, length_group):
    plan = BatchPlan(global_batch=12, seed=7, length_group=length_group)
    epoch = _epoch(source, plan, 1, DataPosition(epoch=1))
    ids = np.concatenate([rows for rows, _ in epoch])
    assert len(ids) == len(set(ids.tolist()))  # no row twice in an epoch
    # Every row but the last partial global batch is trained.
    assert sum(SHARD_SIZES) - len(ids) < plan.global_batch
    for k in range(len(epoch) - 1):  # resumed after every batch: the same rest of the epoch
        resumed = _epoch(source, plan, 1, epoch[k][1])
        assert [list(r) for r, _ in resumed] == [list(r) for r, _ in epoch[k + 1 :]], k
        assert [p for _, p in resumed] == [p for _, p in epoch[k + 1 :]], k
    other_epoch = _epoch(source, plan, 1, DataPosition(epoch=2))
    assert [list(r) for r, _ in other_epoch] != [list(r) for r, _ in epoch]


def test_positions_are_a_few_integers(source):
    plan = BatchPlan(global_batch=12, seed=7, length_group=3)
    for _, position in _epoch(source, plan, 2):
        assert set(position.as_dict()) == {"epoch", "rows", "pool_batches"}
        assert len(json.dumps(position.as_dict())) < 100
        assert DataPosition.from_dict(position.as_dict()) == position
    # A checkpoint written before there was one data path also holds `block` and `offset`.
    old = {"epoch": 1, "block": 0, "offset": 0, "rows": 24, "pool_batches": 1}
    assert DataPosition.from_dict(old) == DataPosition(1, rows=24, pool_batches=1)


def test_length_grouped_pools_hold_the_rows_of_the_plain_cut(source):
    plain = _epoch(source, BatchPlan(global_batch=12, seed=7), 1)
    grouped = _epoch(source, BatchPlan(global_batch=12, seed=7, length_group=3), 1)
    # The same rows in each pool of 3 global batches, regrouped by length.
    for pool in range(len(grouped) // 3):
        plain_rows = sorted(r for rows, _ in plain[3 * pool : 3 * pool + 3] for r in rows)
        assert plain_rows == sorted(r for rows, _ in grouped[3 * pool : 3 * pool + 3] for r in rows)
    widths = [np.ptp((rows * 7919) % 31 + 1) for rows, _ in grouped]
    assert np.mean(widths) < np.mean([np.ptp((rows * 7919) % 31 + 1) for rows, _ in plain])


def test_a_group_resized_mid_epoch_trains_exactly_the_rest(source, monkeypatch):
    monkeypatch.setattr(rank_batches, "CHUNK_ROWS", 8)  # many read chunks per epoch
    plan = BatchPlan(global_batch=12, seed=3, length_group=2)
    whole = [rows for rows, _ in _epoch(source, plan, 1)]
    # W = 3 for 5 batches, then W = 2 for 8 more (a position inside a pool), then W = 1.
    first = _epoch(source, plan, 3, stop_after=5)
    second = _epoch(source, plan, 2, first[-1][1], stop_after=8)
    third = _epoch(source, plan, 1, second[-1][1])
    resized = [rows for rows, _ in first + second + third]
    assert [list(r) for r in resized] == [list(r) for r in whole]
    trained = np.concatenate(resized)
    assert len(trained) == len(set(trained.tolist()))  # nothing twice


def test_each_rank_reads_only_the_rows_it_trains(source):
    plan = BatchPlan(global_batch=12, seed=1)
    readers = [RankBatches(source, plan, r, 3) for r in range(3)]
    delivered = [sum(t.num_rows for t, _ in reader.epoch(DataPosition())) for reader in readers]
    assert [reader.reader.rows_taken for reader in readers] == delivered
    assert sum(delivered) == 400 // 12 * 12


def test_a_resume_deep_in_a_shard_reads_one_window(tmp_path):
    index = _write_shards(tmp_path, sizes=(20_000,))  # one shard: the position is deep in it
    source = IndexedSource(index, span_rows=64, window_rows=512)
    plan = BatchPlan(global_batch=16, seed=2)
    start = DataPosition(0, rows=15_008)
    ranks = RankBatches(source, plan, 0, 1)
    rows, position = next(iter(ranks.batches(start)))
    assert position == DataPosition(0, rows=15_024)
    assert list(rows) == list(source.order(2, 0).rows(15_008, 15_024))
    assert ranks.reader.rows_taken == 0  # working out the rows reads no row


def test_a_position_on_a_changed_index_is_refused(tmp_path):
    plan = BatchPlan(global_batch=12, seed=0)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    before = TrainingStream(IndexedSource(_write_shards(tmp_path / "a")), 400)
    after = TrainingStream(IndexedSource(_write_shards(tmp_path / "b", (200, 200))), 400)
    check_same_stream(before.identity(plan), before.identity(plan), "checkpoint x")  # same: fine
    with pytest.raises(StreamChangedError, match=r"checkpoint x: .*rows 'indexed:"):
        check_same_stream(before.identity(plan), after.identity(plan), "checkpoint x")
    moved = BatchPlan(global_batch=24, seed=0)
    with pytest.raises(StreamChangedError, match="global_batch 12 → 24"):
        check_same_stream(before.identity(plan), before.identity(moved), "checkpoint x")


def test_a_shard_changed_after_indexing_is_named(tmp_path):
    index = _write_shards(tmp_path)
    write_shard(pa.table({ROW_ID: np.arange(3)}), str(tmp_path / "shard-002.arrow"))
    with pytest.raises(ShardIndexError, match=r"shard-002\.arrow: 3 rows, the index says 5"):
        ShardReader(index).take(np.array([37 + 120 + 1]))
