"""MCR² training data: sentences with cluster ids from a column, caps, and similar pairs."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from distributed_emb.checks import ConfigError
from distributed_emb.evaluation.senteval_data import read_sts_benchmark
from distributed_emb.mcr2.data import (
    PairsConfig,
    SentencesConfig,
    idc_pairs,
    load_similar_pairs,
    load_training_sentences,
)
from distributed_emb.paths import shipped_corpus, shipped_senteval_dir
from distributed_emb.settings import build


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
    pairs = load_similar_pairs(PairsConfig(source="sts", min_score=4.5))
    train = read_sts_benchmark(shipped_senteval_dir(), "train")
    keep = train.scores >= 4.5
    assert len(pairs) == int(keep.sum())
    assert pairs.anchors[0] == train.sentences1[int(np.flatnonzero(keep)[0])]
    sampled = load_similar_pairs(PairsConfig(source="sts", min_score=4.5, max_pairs=10))
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
    with pytest.raises(ConfigError, match=r"^pairs.path: is required when pairs.source is 'file'"):
        load_similar_pairs(PairsConfig(source="file"))
    with pytest.raises(ConfigError, match=r"^pairs.sts_sets: is empty; pairs.source 'sts' reads"):
        load_similar_pairs(PairsConfig(source="sts", sts_sets=[]))
    with pytest.raises(ValueError, match="lower pairs.min_score"):
        load_similar_pairs(PairsConfig(source="sts", min_score=6.0))
    # The sections' ranges are their declarations (distributed_emb/settings.py).
    with pytest.raises(ConfigError, match=r"^idc_top_k: must be >= 1, got 0 — idc: the nearest"):
        build(PairsConfig, {"idc_top_k": 0})
    with pytest.raises(ConfigError, match=r"^min_score: must be in \[0, 5\], got 6 — sts: "):
        build(PairsConfig, {"min_score": 6})
    with pytest.raises(ConfigError, match=r"^max_pairs: must be >= 1 or null, got 0 — "):
        build(PairsConfig, {"max_pairs": 0})
    with pytest.raises(ConfigError, match=r"^seed: must be in \[0, 4294967295\], got -1"):
        build(PairsConfig, {"seed": -1})
    with pytest.raises(ConfigError, match=r"^source: expected one of \['idc', 'sts', 'file', "):
        build(PairsConfig, {"source": "labels"})
    with pytest.raises(ConfigError, match=r"^sts_sets: expected a list of items from \['STSB', "):
        build(PairsConfig, {"sts_sets": ["STSB", "STS12"]})
    assert load_similar_pairs(PairsConfig()) is None  # idc: built from the vectors later
    assert load_similar_pairs(PairsConfig(source="none")) is None


def test_bad_sentence_settings_are_named():
    with pytest.raises(ConfigError, match=r"^max_per_cluster: must be >= 1 or null, got 0 — "):
        build(SentencesConfig, {"max_per_cluster": 0})
    with pytest.raises(ConfigError, match=r"^max_sentences: must be >= 1 or null, got -5 — "):
        build(SentencesConfig, {"max_sentences": -5})
    with pytest.raises(ConfigError, match=r"^min_sentences: must be >= 1, got 0 — documents"):
        build(SentencesConfig, {"min_sentences": 0})
    with pytest.raises(ConfigError, match=r"^unknown config key 'max_rows'"):
        build(SentencesConfig, {"max_rows": 10})
    assert build(SentencesConfig, {"max_sentences": None}).max_sentences is None


def test_default_sentences_are_every_shipped_document():
    expected_texts, expected_ids = [], []
    for name in ("wiki_documents.jsonl", "lee_documents.jsonl"):
        with open(shipped_corpus(name), encoding="utf-8") as source:
            for row in map(json.loads, source):
                expected_texts += row["sentences"]
                expected_ids += [row["id"]] * len(row["sentences"])
    data = load_training_sentences(SentencesConfig())
    assert data.texts == expected_texts  # all of them: no per-document cap by default
    assert data.num_clusters == len(set(expected_ids)) == 97 + 300
    assert [data.cluster_names[i] for i in data.cluster_ids] == expected_ids


def _reference_idc_pairs(vectors: np.ndarray) -> set[frozenset[int]]:
    """Plain IDC on one document: each sentence joined to its nearest other sentence (cosine),
    connected components, every pair inside a component."""
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    similarity = unit @ unit.T
    np.fill_diagonal(similarity, -np.inf)
    parent = list(range(len(vectors)))

    def find(i):
        while parent[i] != i:
            i = parent[i]
        return i

    for i, j in enumerate(similarity.argmax(1)):
        parent[find(i)] = find(int(j))
    groups: dict[int, list[int]] = {}
    for i in range(len(vectors)):
        groups.setdefault(find(i), []).append(i)
    return {frozenset((a, b)) for g in groups.values() for a in g for b in g if a < b}


def test_idc_pairs_are_the_nearest_neighbour_components_inside_each_document():
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((14, 6))
    cluster_ids = np.array([0] * 6 + [1] * 7 + [2])  # the one-sentence document gives none
    texts = [f"s{i}" for i in range(14)]
    pairs = idc_pairs(texts, vectors, cluster_ids, PairsConfig(idc_max_pairs_per_cluster=None))
    got = {frozenset((int(a[1:]), int(p[1:]))) for a, p in zip(pairs.anchors, pairs.positives)}
    expected = _reference_idc_pairs(vectors[:6]) | {
        frozenset((a + 6, b + 6)) for a, b in map(tuple, _reference_idc_pairs(vectors[6:13]))
    }
    assert got == expected and len(pairs) == len(expected)
    assert "inside 2 documents" in pairs.summary
    with pytest.raises(ValueError, match="IDC found no pairs"):
        idc_pairs(["a", "b"], vectors[:2], np.array([0, 1]), PairsConfig())


def test_held_out_documents_never_reach_the_heads_training_rows(tmp_path):
    """The documents heldout.* holds out (by the hash every method uses, decided by the id
    alone) are in no training sentence and no cluster; the rows of one id stay together; the
    run's yardstick is built from them alone."""
    import dataclasses

    from distributed_emb.data.held_out import HeldOutConfig, held_out_split
    from distributed_emb.mcr2 import pipeline
    from distributed_emb.mcr2.compression_config import MCR2Config

    rows = [
        {"id": f"doc-{d}", "sentences": [f"doc {d} part {part} sentence {i}." for i in range(7)]}
        for d in range(40)
        for part in (0, 1)  # two rows per id: one document, one cluster
    ]
    path = _write_jsonl(tmp_path / "docs.jsonl", rows)
    heldout = HeldOutConfig(fraction=0.4, seed=3)
    data = load_training_sentences(SentencesConfig(paths=[path]), heldout)
    split = {f"doc-{d}": held_out_split(f"doc-{d}", 0.4, 3) for d in range(40)}
    held_ids = {doc_id for doc_id, where in split.items() if where is not None}
    assert {"dev", "test"} <= set(split.values()) and 0 < len(held_ids) < 40
    assert [row["doc_id"] for row in data.held_out] == [d for d in split if d in held_ids]
    assert not held_ids & set(data.cluster_names)  # no cluster of a held-out document
    held_texts = {s for row in data.held_out for s in row["sentences"]}
    assert not held_texts & set(data.texts)  # no sentence either
    everything = {s for row in rows for s in row["sentences"]}
    assert held_texts | set(data.texts) == everything  # and nothing else is lost
    assert all(len(row["sentences"]) == 14 for row in data.held_out)  # both rows of an id
    assert f"{len(held_ids)} documents held out" in data.summary
    # None (and fraction 0) hold nothing out: the heads' data as before.
    assert load_training_sentences(SentencesConfig(paths=[path])).held_out == []
    nothing = load_training_sentences(SentencesConfig(paths=[path]), HeldOutConfig(fraction=0))
    assert len(nothing.texts) == len(everything) and nothing.held_out == []

    # The yardstick: passages of held-out documents only, dev and test by the same hash.
    config = MCR2Config(heldout=heldout, sentences=SentencesConfig(paths=[path]))
    config.output = dataclasses.replace(config.output, dir=str(tmp_path / "run"))
    written = pipeline.write_documents_yardstick(config, data.held_out)
    corpus = [json.loads(line) for line in open(f"{written}/corpus.jsonl", encoding="utf-8")]
    assert {row["_id"].split("#")[0] for row in corpus} == held_ids
    for row in corpus:  # each passage: consecutive sentences of held-out documents
        assert set(re.split(r"(?<=\.) ", row["text"])) <= held_texts
    for where in ("dev", "test"):
        queries = open(f"{written}/qrels/{where}.tsv", encoding="utf-8").read().splitlines()[1:]
        assert {split[q.split("#")[0]] for q in queries} == {where}
