"""data/shuffle.py: an epoch's order over indexed shards, checked against a plain list-based
reference of the same four steps, and for how well it mixes shards and forgets corpus order
(sizes scaled down from bench/shuffle_quality.py's: 16 shards of 1562 rows instead of 100k,
spans of 16 rows, windows of 4096)."""

from __future__ import annotations

import numpy as np
import pytest

from distributed_emb.data.shuffle import ShardOrder

LAYOUTS = {
    "uneven": (5000, 37, 0, 1200, 999),
    "one shard": (3000,),
    "shards smaller than a span": (5, 3, 17, 1, 40),
    "empty": (),
}
SPAN, WINDOW = 64, 256


def reference_order(shard_rows, seed, epoch, span_rows, window_rows) -> np.ndarray:
    """The four steps of the module docstring with lists, one generator call each."""
    total = sum(shard_rows)
    spans = [list(range(b, min(b + span_rows, total))) for b in range(0, total, span_rows)]
    permutation = np.random.default_rng([seed, epoch, 0]).permutation(len(spans))
    spans = [spans[i] for i in permutation]
    per_window = max(1, window_rows // span_rows)
    order = []
    for window, begin in enumerate(range(0, len(spans), per_window)):
        rows = np.array([row for span in spans[begin : begin + per_window] for row in span])
        order.extend(np.random.default_rng([seed, epoch, 1, window]).permutation(rows))
    return np.array(order, dtype=np.int64)


def distinct_labels_per_batch(order, shard_rows, batch) -> float:
    label = [shard for shard, rows in enumerate(shard_rows) for _ in range(rows)]
    counts = [
        len({label[row] for row in order[begin : begin + batch]})
        for begin in range(0, len(order) - batch + 1, batch)
    ]
    return sum(counts) / len(counts)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("epoch", [0, 1, 2])
def test_every_epoch_is_a_permutation_of_the_corpus(layout, epoch):
    order = ShardOrder(LAYOUTS[layout], seed=7, epoch=epoch, span_rows=SPAN, window_rows=WINDOW)
    rows = order.rows(0, order.total)
    assert rows.dtype == np.int64
    assert order.total == sum(LAYOUTS[layout])
    np.testing.assert_array_equal(np.sort(rows), np.arange(sum(LAYOUTS[layout])))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("span_rows, window_rows", [(SPAN, WINDOW), (64, 10), (1, 7), (500, 1)])
def test_order_is_the_plain_reference(layout, span_rows, window_rows):
    # The seeding is part of the contract: a checkpoint resumed by another build of this code
    # must find the same order.
    shard_rows = LAYOUTS[layout]
    order = ShardOrder(shard_rows, 3, 1, span_rows=span_rows, window_rows=window_rows)
    expected = reference_order(shard_rows, 3, 1, span_rows, window_rows)
    np.testing.assert_array_equal(order.rows(0, order.total), expected)


def test_pieces_equal_the_whole_in_any_request_order():
    shard_rows = LAYOUTS["uneven"]
    whole = ShardOrder(shard_rows, 11, 0, span_rows=SPAN, window_rows=WINDOW).rows(0, 7236)
    order = ShardOrder(shard_rows, 11, 0, span_rows=SPAN, window_rows=WINDOW)
    batches = [order.rows(start, min(start + 50, order.total)) for start in range(0, 7236, 50)]
    np.testing.assert_array_equal(np.concatenate(batches), whole)
    cuts = [0, 1, 255, 256, 257, 3000, 7000, 7235, 7236]
    for start, stop in [(3000, 7000), (0, 1), (255, 257), (7235, 7236), (256, 3000)]:
        np.testing.assert_array_equal(order.rows(start, stop), whole[start:stop])  # back and forth
    assert [len(order.rows(cut, cut)) for cut in cuts] == [0] * len(cuts)
    assert len(order._last_window) == 1  # one window held, however many were read


def test_deterministic_and_each_epoch_and_seed_differs():
    shard_rows = LAYOUTS["uneven"]

    def rows(seed, epoch):
        return ShardOrder(shard_rows, seed, epoch, span_rows=SPAN, window_rows=WINDOW).rows(0, 7236)

    np.testing.assert_array_equal(rows(5, 2), rows(5, 2))
    assert ShardOrder(list(shard_rows), 5, 2) == ShardOrder(shard_rows, 5, 2)
    for other in [rows(5, 3), rows(6, 2)]:
        assert (other != rows(5, 2)).mean() > 0.9


def test_seed_none_is_corpus_order():
    order = ShardOrder(LAYOUTS["uneven"], None, 4, span_rows=SPAN, window_rows=WINDOW)
    np.testing.assert_array_equal(order.rows(0, order.total), np.arange(7236))
    np.testing.assert_array_equal(order.rows(100, 164), np.arange(100, 164))


def test_a_window_holds_whole_spans_from_across_the_corpus():
    # 3 shards of 10 spans; windows of 4 spans, the last one of 2.
    shard_rows, spans_per_window = (640, 640, 640), WINDOW // SPAN
    rows = ShardOrder(shard_rows, 2, 0, span_rows=SPAN, window_rows=WINDOW).rows(0, 1920)
    shards_seen = set()
    for begin in range(0, 1920, WINDOW):
        spans, counts = np.unique(rows[begin : begin + WINDOW] // SPAN, return_counts=True)
        assert list(counts) == [SPAN] * len(spans)  # every span whole, in one window
        assert len(spans) == min(spans_per_window, 30 - begin // SPAN)
        shards_seen.add(len(set(spans * SPAN // 640)))
    assert max(shards_seen) > 1  # spans of different shards interleave


def test_one_shard_is_shuffled_over_its_whole_length():
    order = ShardOrder((200_000,), 0, 0, span_rows=64, window_rows=1024)
    rows = order.rows(0, order.total)
    # The rows are a permutation, so their ranks are themselves: Pearson here is Spearman.
    assert abs(np.corrcoef(np.arange(len(rows)), rows)[0, 1]) < 0.05
    assert np.ptp(rows[:1024]) > 100_000  # the first window draws from across the file


def test_a_deep_range_builds_only_the_windows_it_overlaps(monkeypatch):
    built = []
    window = ShardOrder._window

    def counting(self, index):
        built.append(index)
        return window(self, index)

    monkeypatch.setattr(ShardOrder, "_window", counting)
    order = ShardOrder((10_000_000,), 0, 0)
    rows = order.rows(9_999_000, 9_999_064)
    assert len(rows) == 64 and len(set(rows.tolist())) == 64
    assert built == [9_999_000 // (1 << 18)]


# 16 shards, one label each; batch 64. A uniform permutation gives ≈ 16·(1 − (15/16)^64) ≈ 15.7
# shards per batch; py1e, which moves rows at most about one block from their shard's place,
# about 2.5 at these sizes.
MIX_SHARDS = (1562,) * 16
MIX_FLOOR = 14.0


def test_batches_mix_the_shards():
    order = ShardOrder(MIX_SHARDS, 0, 0, span_rows=16, window_rows=4096)
    assert distinct_labels_per_batch(order.rows(0, order.total), MIX_SHARDS, 64) > MIX_FLOOR


def test_py1e_does_not_reach_the_mixing_floor():
    from bench.shuffle_quality import py1e_order

    try:
        order = py1e_order(list(MIX_SHARDS), 1, 0, 0, block_size=4096, batch=64)
    except ImportError as error:
        pytest.skip(f"no py1e to compare with ({error})")
    np.testing.assert_array_equal(np.sort(order), np.arange(sum(MIX_SHARDS)))
    assert distinct_labels_per_batch(order, MIX_SHARDS, 64) < MIX_FLOOR


def test_the_order_is_the_corpus_s_whatever_its_cut_into_shards():
    # Two builds of one corpus may cut it into different files (Ray Data's sort samples its
    # bounds at random): both must train the same batches.
    cuts = [LAYOUTS["uneven"], (7236,), (3618, 3618), (1, 7234, 1)]
    orders = [ShardOrder(cut, 9, 1, span_rows=SPAN, window_rows=WINDOW) for cut in cuts]
    for order in orders[1:]:
        np.testing.assert_array_equal(order.rows(0, 7236), orders[0].rows(0, 7236))
