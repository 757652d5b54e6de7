"""One stream of global batches (data/global_batches.py) in the epoch order of
data/epoch_order.py: the same batches for any number of workers, a position of a few integers
that resumes the sequence exactly, and each row read once per epoch.

The order is checked against the single-process reference (`global_batches` over
`local_epoch_tables`, no Ray); the feeder actor is checked against that reference with 1, 2,
3 and 5 ranks (5 do not divide the global batch of 12), the ranks played by this process.
"""

import json

import numpy as np
import pytest

from distributed_emb.data.data_config import DataConfig
from distributed_emb.data.epoch_order import DataPosition, EpochOrder
from distributed_emb.data.global_batches import (
    BatchPlan,
    chunk_batches,
    global_batches,
    split_rows,
)
from distributed_emb.data.stream import local_epoch_tables, text_source

LINES_PER_FILE = (150, 90, 61)
BAD_LINES = 3  # in the jsonl file: dropped and counted, never batched


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Three files, several source blocks each, one with lines the cleaning drops."""
    root = tmp_path_factory.mktemp("stream_corpus")
    for index, lines in enumerate(LINES_PER_FILE[:2]):
        text = "\n".join(f"file {index} sentence {n}" for n in range(lines))
        (root / f"part{index}.txt").write_text(text + "\n")
    records = [json.dumps({"text": f"file 2 record {n}"}) for n in range(LINES_PER_FILE[2])]
    records[5:5] = ["", "{not json", json.dumps({"text": "   "})]
    (root / "part2.jsonl").write_text("\n".join(records) + "\n")
    return root


def clean_rows() -> int:
    return sum(LINES_PER_FILE)


def data_config(corpus) -> DataConfig:
    return DataConfig(path=str(corpus), block_rows=40, shuffle_seed=7)


def reference(corpus, plan: BatchPlan, start: DataPosition):
    """[(row ids of each global batch, position after it)] read in this process."""
    source = text_source(data_config(corpus), counter=None)
    tables = local_epoch_tables(source, EpochOrder(plan.seed, start.epoch), start)
    return [
        (batch.column("_row_id").to_pylist(), position)
        for batch, position in global_batches(tables, plan, start)
    ]


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


def test_chunks_hold_about_the_same_rows_whatever_the_split():
    assert chunk_batches(4096, 2) == 1
    assert chunk_batches(12, 5) == 2048 // 3  # sized by the largest slice, ⌈12/5⌉ rows
    assert chunk_batches(2, 4) == 2048  # more ranks than rows: some slices are empty


@pytest.mark.parametrize("length_group", [1, 3])
def test_a_position_resumes_the_same_sequence(corpus, length_group):
    plan = BatchPlan(global_batch=12, seed=7, length_group=length_group)
    epoch = reference(corpus, plan, DataPosition(epoch=1))
    ids = [row for rows, _ in epoch for row in rows]
    assert len(ids) == len(set(ids))  # no row twice in an epoch
    # Every clean row but the last partial global batch (or pool's remainder) is trained.
    assert clean_rows() - len(ids) < plan.global_batch * length_group
    for k in range(len(epoch) - 1):  # resumed after every batch: the same rest of the epoch
        resumed = reference(corpus, plan, epoch[k][1])
        assert resumed == epoch[k + 1 :], k
    other_epoch = reference(corpus, plan, DataPosition(epoch=2))
    assert [rows for rows, _ in other_epoch] != [rows for rows, _ in epoch]
    assert sorted(r for rows, _ in other_epoch for r in rows) != []


def test_positions_are_a_few_integers(corpus):
    plan = BatchPlan(global_batch=12, seed=7, length_group=3)
    for _, position in reference(corpus, plan, DataPosition()):
        assert set(position.as_dict()) == {"epoch", "block", "offset", "rows", "pool_batches"}
        assert len(json.dumps(position.as_dict())) < 100


def test_length_grouped_batches_are_narrow_and_hold_the_same_rows(corpus):
    plain = reference(corpus, BatchPlan(global_batch=12, seed=7), DataPosition())
    grouped = reference(corpus, BatchPlan(global_batch=12, seed=7, length_group=3), DataPosition())
    # The same rows in each pool of 3 global batches, regrouped.
    for pool in range(len(grouped) // 3):
        plain_rows = sorted(r for rows, _ in plain[3 * pool : 3 * pool + 3] for r in rows)
        assert plain_rows == sorted(r for rows, _ in grouped[3 * pool : 3 * pool + 3] for r in rows)


def _served(source, plan, world, start, chunk_rows=None):
    """(row ids of each global batch and the position after it, as the ranks got them; rows
    the cleaning tasks read)."""
    import ray
    from harness.feeder import served_batches

    served = [
        (batch.column("_row_id").to_pylist(), position)
        for batch, position in served_batches(source, plan, world, start, chunk_rows)
    ]
    return served, ray.get(source.counter.rows_read.remote())


@pytest.mark.ray
def test_one_feeder_serves_the_reference_order_to_any_number_of_ranks(ray_local, corpus):
    from distributed_emb.data.corpus import start_drop_counter

    plan = BatchPlan(global_batch=12, seed=7)
    expected = reference(corpus, plan, DataPosition(epoch=1))
    for world in (1, 2, 3, 5):
        source = text_source(data_config(corpus), start_drop_counter())
        served, rows_read = _served(source, plan, world, DataPosition(epoch=1))
        assert served == expected, world
        # Each line of every file was read once in the epoch, whatever the world size.
        assert rows_read == clean_rows() + BAD_LINES, world

    # A chunk per global batch: the epoch's 25 batches go through 25 chunks and the feeder's
    # bounded buffer (AHEAD chunks), with 3 ranks asking in turn: the same sequence.
    source = text_source(data_config(corpus), start_drop_counter())
    served, _ = _served(source, plan, 3, DataPosition(epoch=1), chunk_rows=1)
    assert len(served) > 4 * 4 and served == expected

    # Two ranks trained 4 global batches, then the run resumed on one: the same sequence goes on.
    source = text_source(data_config(corpus), start_drop_counter())
    resumed, rows_read = _served(source, plan, 1, expected[3][1])
    assert resumed == expected[4:]
    # The resumed epoch did not read the files it had finished.
    assert rows_read < clean_rows()
