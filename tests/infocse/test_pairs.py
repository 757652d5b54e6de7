"""Round-to-round pair overlap and the one-pair-per-document batch arrangement."""

from __future__ import annotations

import numpy as np
import pytest

from distributed_emb.infocse.pairs import (
    arrange_by_document,
    arrange_pairs,
    pair_overlap,
    read_pairs,
)


def batches_of(order, doc_ids, batch_size):
    docs = [doc_ids[i] for i in order]
    return [docs[k : k + batch_size] for k in range(0, len(docs), batch_size)]


def test_overlap_is_unordered_and_by_text():
    previous = [("a", "b"), ("c", "d"), ("e", "f"), ("b", "a")]  # ("b", "a") repeats ("a", "b")
    current = [
        {"anchor": "b", "positive": "a"},
        {"anchor": "c", "positive": "d"},
        {"anchor": "x", "positive": "y"},
    ]
    overlap = pair_overlap(previous, current)
    assert (overlap.previous, overlap.current, overlap.common, overlap.new) == (3, 3, 2, 1)
    assert overlap.jaccard == pytest.approx(2 / 4)
    assert overlap.kept_fraction == pytest.approx(2 / 3)
    assert pair_overlap([], []).jaccard == 1.0


def test_arrangement_is_a_permutation_without_repeats_when_possible():
    rng = np.random.default_rng(0)
    for trial in range(60):
        batch_size = int(rng.integers(1, 9))
        total = int(rng.integers(1, 80))
        num_batches = -(-total // batch_size)
        # Document sizes up to num_batches − 1: a repeat-free layout always exists.
        doc_ids, d = [], 0
        while len(doc_ids) < total:
            size = int(rng.integers(1, max(num_batches - 1, 1) + 1))
            doc_ids += [f"d{d}"] * min(size, total - len(doc_ids))
            d += 1
        rng.shuffle(doc_ids)
        arrangement = arrange_by_document(doc_ids, batch_size, seed=trial)
        assert sorted(arrangement.order.tolist()) == list(range(total))
        assert arrangement.num_batches == num_batches
        chunks = batches_of(arrangement.order, doc_ids, batch_size)
        repeats = sum(len(set(c)) < len(c) for c in chunks)
        assert repeats == arrangement.batches_with_repeats
        assert repeats == 0, (trial, doc_ids, batch_size)


def test_document_with_as_many_pairs_as_batches_fits():
    # 3 batches of 4; document "big" has 3 pairs: it can and must sit in each batch once.
    doc_ids = ["big"] * 3 + [f"s{i}" for i in range(9)]
    arrangement = arrange_by_document(doc_ids, batch_size=4, seed=1)
    assert arrangement.batches_with_repeats == 0 and arrangement.crowded_documents == 0


def test_crowded_document_repeats_and_is_reported():
    # 10 pairs of one document, 4 of others, batches of 2 → 7 batches: "big" must repeat.
    doc_ids = ["big"] * 10 + ["a", "b", "c", "d"]
    arrangement = arrange_by_document(doc_ids, batch_size=2, seed=0)
    chunks = batches_of(arrangement.order, doc_ids, 2)
    assert arrangement.crowded_documents == 1
    assert arrangement.batches_with_repeats == sum(len(set(c)) < len(c) for c in chunks)
    assert arrangement.batches_with_repeats == 3  # 10 "big" over 7 batches: 3 doubled at least


def test_seeded_and_last_partial_batch_stays_last():
    doc_ids = [f"d{i % 7}" for i in range(23)]
    a = arrange_by_document(doc_ids, batch_size=5, seed=3)
    b = arrange_by_document(doc_ids, batch_size=5, seed=3)
    c = arrange_by_document(doc_ids, batch_size=5, seed=4)
    assert np.array_equal(a.order, b.order)
    assert not np.array_equal(a.order, c.order)
    assert len(batches_of(a.order, doc_ids, 5)[-1]) == 3


def test_arrange_pairs_and_edge_cases(tmp_path):
    pairs = [{"anchor": f"a{i}", "positive": f"p{i}", "doc_id": f"d{i % 3}"} for i in range(6)]
    ordered, arrangement = arrange_pairs(pairs, batch_size=3, seed=0)
    assert sorted(p["anchor"] for p in ordered) == sorted(p["anchor"] for p in pairs)
    assert arrangement.batches_with_repeats == 0
    assert arrange_by_document([], batch_size=4).order.shape == (0,)
    with pytest.raises(ValueError, match="batch_size"):
        arrange_by_document(["a"], batch_size=0)
    with pytest.raises(FileNotFoundError, match="no Parquet"):
        read_pairs(str(tmp_path))
