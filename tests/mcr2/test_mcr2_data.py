"""MCR² training data: sentences with cluster ids from a column, caps, and similar pairs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from distributed_emb.evaluation.senteval_data import read_sts_benchmark
from distributed_emb.mcr2.data import (
    PairsConfig,
    SentencesConfig,
    load_similar_pairs,
    load_training_sentences,
)
from distributed_emb.paths import shipped_senteval_dir


def _write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_documents_become_clusters_and_caps_apply(tmp_path):
    path = _write_jsonl(
        tmp_path / "docs.jsonl",
        [
            {"id": "a", "sentences": [f"a{i}" for i in range(10)]},
            {"id": "b", "sentences": ["b0", "b1"]},
            {"id": "a", "sentences": ["a10"]},  # same id: same cluster
            {"id": "c", "sentences": ["c0"]},
        ],
    )
    data = load_training_sentences(SentencesConfig(paths=[path], max_per_cluster=4))
    assert data.cluster_names == ["a", "b", "c"]
    counts = np.bincount(data.cluster_ids)
    assert counts.tolist() == [4, 2, 1]
    assert all(
        t.startswith(name)
        for t, i in zip(data.texts, data.cluster_ids)
        for name in [data.cluster_names[i]]
    )
    assert "7 sentences left out by the caps" in data.summary

    capped = load_training_sentences(
        SentencesConfig(paths=[path], max_per_cluster=None, max_sentences=5)
    )
    assert len(capped.texts) == 5


def test_a_label_column_splits_texts_and_skips_bad_rows(tmp_path):
    path = _write_jsonl(
        tmp_path / "labelled.jsonl",
        [
            {"label": 1, "text": "Good film. Great cast."},
            {"label": 0, "text": "Bad plot."},
            {"label": 1, "text": "Loved it."},
            {"text": "no label here"},
        ],
    )
    data = load_training_sentences(SentencesConfig(paths=[path], id_column="label"))
    assert data.texts == ["Good film.", "Great cast.", "Loved it.", "Bad plot."]
    assert data.cluster_ids.tolist() == [0, 0, 0, 1]
    assert "dropped: missing_id=1" in data.summary  # the row without a label, counted


def test_sts_pairs_keep_scores_at_or_above_the_threshold():
    pairs = load_similar_pairs(PairsConfig(min_score=4.5))
    train = read_sts_benchmark(shipped_senteval_dir(), "train")
    keep = train.scores >= 4.5
    assert len(pairs) == int(keep.sum())
    assert pairs.anchors[0] == train.sentences1[int(np.flatnonzero(keep)[0])]
    sampled = load_similar_pairs(PairsConfig(min_score=4.5, max_pairs=10))
    assert len(sampled) == 10 and set(sampled.anchors) <= set(pairs.anchors)


def test_pairs_file_reads_columns_and_counts_bad_rows(tmp_path):
    path = _write_jsonl(
        tmp_path / "pairs.jsonl",
        [
            {"q": "a cat", "p": "a kitten"},
            {"q": "a dog", "p": ""},  # empty: dropped and counted
            {"q": "rain", "p": "showers"},
        ],
    )
    pairs = load_similar_pairs(
        PairsConfig(source="file", path=path, anchor_column="q", positive_column="p")
    )
    assert pairs.anchors == ["a cat", "rain"] and pairs.positives == ["a kitten", "showers"]
    assert "empty=1" in pairs.summary


def test_bad_pair_settings_are_named():
    with pytest.raises(ValueError, match="pairs.path is required"):
        load_similar_pairs(PairsConfig(source="file"))
    with pytest.raises(ValueError, match="lower pairs.min_score"):
        load_similar_pairs(PairsConfig(min_score=6.0))
    assert load_similar_pairs(PairsConfig(source="none")) is None
