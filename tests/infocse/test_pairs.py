"""Round-to-round pair overlap (the in-memory reference and its Ray Data version) and the
written order of a round's pairs (spread over documents, the same on every run)."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_emb.infocse.annotation_tables import spread_keys
from distributed_emb.infocse.pairs import pair_overlap, pair_overlap_on_cluster, read_pairs


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


def _write_round(directory, pairs: list[dict], files: int) -> str:
    directory.mkdir()
    for index in range(files):
        pq.write_table(pa.Table.from_pylist(pairs[index::files]), directory / f"{index}.parquet")
    return str(directory)


@pytest.mark.ray
def test_the_cluster_overlap_counts_what_the_reference_counts(ray_local, tmp_path):
    """Repeats within a round, reversed pairs and pairs only one round has, over several
    files: the counts from Ray Data equal the in-memory reference's."""
    rng = random.Random(0)
    texts = [f"sentence {i}" for i in range(60)]

    def mined(count):
        pairs = []
        for _ in range(count):
            a, b = rng.sample(texts, 2)
            pairs.append({"anchor": a, "positive": b, "doc_id": "d"})
        return pairs + [{**p, "anchor": p["positive"], "positive": p["anchor"]} for p in pairs[:7]]

    previous, current = mined(300), mined(300)
    current += previous[:40]  # pairs found again
    expected = pair_overlap(previous, current)
    assert 0 < expected.common < expected.current
    found = pair_overlap_on_cluster(
        _write_round(tmp_path / "previous", previous, 3),
        _write_round(tmp_path / "current", current, 2),
    )
    assert found == expected


def test_the_written_order_spreads_documents_and_does_not_depend_on_the_input_order():
    doc_ids = [f"doc{d}" for d in range(20) for _ in range(30)]  # 20 documents × 30 pairs
    table = pa.table({
        "doc_id": doc_ids,
        "anchor": [f"a{i}" for i in range(600)],
        "positive": [f"p{i}" for i in range(600)],
    })  # fmt: skip
    keys = spread_keys(table, seed=3)
    shuffled = np.random.default_rng(0).permutation(600)
    # Each pair's key is its own: the same whatever order or batch it arrives in.
    np.testing.assert_array_equal(spread_keys(table.take(shuffled), seed=3), keys[shuffled])
    assert not np.array_equal(spread_keys(table, seed=4), keys)  # the seed draws the order
    written = [doc_ids[i] for i in np.argsort(keys, kind="stable")]
    distinct = [len(set(written[k : k + 16])) for k in range(0, 600, 16)]
    # In the annotation's document order a batch of 16 holds 1–2 documents; drawn at random
    # from 20 equal documents it holds 20·(1 − (19/20)^16) ≈ 11.2 on average.
    assert np.mean(distinct) > 9


def test_reading_a_round_without_pairs_names_the_place(tmp_path):
    with pytest.raises(FileNotFoundError, match="no Parquet"):
        read_pairs(str(tmp_path))
