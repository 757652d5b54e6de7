"""evaluation/beir.py: the BEIR-layout reader and its errors, exact sharded search, and the
metrics checked against a plain-Python reference written from their definitions."""

from __future__ import annotations

import hashlib
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from distributed_emb.evaluation.beir import (
    METRICS,
    BeirDataError,
    RetrievalSplit,
    evaluate_split,
    evaluate_splits,
    list_splits,
    per_query_metrics,
    read_split,
    retrieval_metrics,
    search,
)

# --- a BEIR directory -------------------------------------------------------------------------

CORPUS = [
    {"_id": "d1", "title": "Paris", "text": "The capital of France. "},
    {"_id": "d2", "title": "", "text": " Berlin is in Germany."},
    {"_id": "d3", "text": "Rome is in Italy."},
    {"_id": "q2", "title": "Madrid", "text": "Spain's capital."},
]
QUERIES = [
    {"_id": "q1", "text": "capital of France"},
    {"_id": "q2", "text": "capital of Spain"},
    {"_id": "q3", "text": "Italy"},
    {"_id": "q4", "text": "Germany"},
]
QRELS = {
    "test": "query-id\tcorpus-id\tscore\nq1\td1\t2\nq1\td2\t0\nq2\tq2\t1\nq4\td2\t0\n",
    "dev": "query-id\tcorpus-id\tscore\nq3\td3\t1\n",
}


def write_beir(root: Path, corpus=CORPUS, queries=QUERIES, qrels=QRELS) -> Path:
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    for split, text in qrels.items():
        (root / "qrels" / f"{split}.tsv").write_text(text)
    return root


def hashed_encoder(dim: int = 8):
    """A deterministic stand-in encoder: a fixed pseudo-random vector per distinct text."""

    def encode(texts: list[str]) -> np.ndarray:
        rows = []
        for text in texts:
            seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
            rows.append(np.random.default_rng(seed).normal(size=dim))
        return np.array(rows, dtype=np.float32).reshape(len(texts), dim)

    return encode


def test_reader_joins_title_and_text_and_keeps_queries_with_a_relevant_document(tmp_path):
    directory = str(write_beir(tmp_path))
    assert list_splits(directory) == ["dev", "test"]
    split = read_split(directory, "test")
    assert split.name == "test"
    assert split.corpus_ids == ["d1", "d2", "d3", "q2"]
    assert split.corpus_texts == [
        "Paris The capital of France.",
        "Berlin is in Germany.",
        "Rome is in Italy.",
        "Madrid Spain's capital.",
    ]
    # q4 is judged only 0; q3 is a dev query.
    assert split.query_ids == ["q1", "q2"]
    assert split.query_texts == ["capital of France", "capital of Spain"]
    assert split.qrels == {"q1": {"d1": 2, "d2": 0}, "q2": {"q2": 1}}


def _edit(root: Path, name: str, text: str) -> None:
    (root / name).write_text(text)


HEADER = "query-id\tcorpus-id\tscore\n"
D1 = '{"_id": "d1", "text": "a"}\n'
Q1 = '{"_id": "q1", "text": "a"}\n'


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("corpus.jsonl", None, r"corpus.jsonl: no such file; expected the BEIR layout"),
        ("corpus.jsonl", D1 + '{"_id": "d2", "text": ', r"corpus.jsonl:2: not valid JSON"),
        ("corpus.jsonl", D1 + '\n{"text": "b"}\n', r'corpus.jsonl:3: no "_id" field'),
        ("queries.jsonl", '{"_id": "q1"}\n', r'queries.jsonl:1: no "text" field'),
        ("queries.jsonl", '{"_id": "q1", "text": 3}\n', r'queries.jsonl:1: "text" must be a str'),
        ("corpus.jsonl", D1 + D1, r"corpus.jsonl:2: duplicate _id 'd1' \(first at line 1\)"),
        ("queries.jsonl", Q1 + Q1, r"queries.jsonl:2: duplicate _id 'q1'"),
        ("corpus.jsonl", b'{"_id": "d1", "text": "\xff"}\n', r"corpus.jsonl:1: .* not valid UTF-8"),
        ("qrels/test.tsv", HEADER + "q1\td1\n", r"test.tsv:2: expected 3 tab-separated columns"),
        ("qrels/test.tsv", HEADER + "q1\td1\t1.5\n", r"test.tsv:2: score '1.5' is not an integer"),
        (
            "qrels/test.tsv",
            HEADER + "q1\td1\t1\nq9\td1\t1\n",
            r"test.tsv:3: query-id 'q9' is not in",
        ),
        ("qrels/test.tsv", HEADER + "q1\td9\t1\n", r"test.tsv:2: corpus-id 'd9' is not in corpus"),
        ("qrels/test.tsv", "q1\td1\t1\n", r"test.tsv:1: expected the header query-id<TAB>corpus"),
        ("qrels/test.tsv", HEADER + "q1\td1\t1\nq1\td1\t2\n", r"test.tsv:3: .* judged twice"),
        ("qrels/test.tsv", HEADER + "q1\td1\t0\n", r"test.tsv: no query has a relevant document"),
    ],
)
def test_reader_errors_name_the_file_and_line(tmp_path, name, text, message):
    root = write_beir(tmp_path)
    if text is None:
        (root / name).unlink()
    elif isinstance(text, bytes):
        (root / name).write_bytes(text)
    else:
        _edit(root, name, text)
    with pytest.raises(BeirDataError, match=message):
        read_split(str(root), "test")


def test_a_missing_split_names_the_splits_there(tmp_path):
    root = write_beir(tmp_path)
    with pytest.raises(BeirDataError, match=r"qrels/train.tsv: no such file; .* are dev, test$"):
        read_split(str(root), "train")
    with pytest.raises(BeirDataError, match=r"elsewhere is not a directory"):
        list_splits(str(tmp_path / "elsewhere"))
    (tmp_path / "no_qrels").mkdir()
    with pytest.raises(BeirDataError, match=r"qrels: no such directory; expected the BEIR layout"):
        list_splits(str(tmp_path / "no_qrels"))


def test_a_shipped_set_is_named_by_its_name():
    assert list_splits("shipped:news") == ["dev", "test"]
    with pytest.raises(BeirDataError, match=r"shipped:nope: no shipped retrieval set 'nope'"):
        list_splits("shipped:nope")


# --- the metrics against a reference from their definitions ----------------------------------


def _ranking(hits: dict[str, float]) -> list[str]:
    """trec_eval's order: score descending, ties by document id descending."""
    return [doc for doc, _ in sorted(hits.items(), key=lambda h: (h[1], h[0]), reverse=True)]


def _relevant(judged: dict[str, int]) -> set[str]:
    return {doc for doc, rel in judged.items() if rel >= 1}


def reference_ndcg_at_10(judged, hits) -> float:
    """Linear gain rel / log2(rank + 1); the ideal DCG from every judged document."""
    dcg = sum(judged.get(doc, 0) / math.log2(i + 2) for i, doc in enumerate(_ranking(hits)[:10]))
    ideal = sorted((rel for rel in judged.values() if rel > 0), reverse=True)[:10]
    return dcg / sum(rel / math.log2(i + 2) for i, rel in enumerate(ideal))


def reference_ap_at_100(judged, hits) -> float:
    """Sum of the precision at each relevant rank <= 100, over the number of relevant docs."""
    relevant, found, total = _relevant(judged), 0, 0.0
    for rank, doc in enumerate(_ranking(hits)[:100], 1):
        if doc in relevant:
            found += 1
            total += found / rank
    return total / len(relevant)


def reference_recall(judged, hits, k: int) -> float:
    relevant = _relevant(judged)
    return len(relevant & set(_ranking(hits)[:k])) / len(relevant)


def reference_rr_at_10(judged, hits) -> float:
    relevant = _relevant(judged)
    ranks = [r for r, doc in enumerate(_ranking(hits)[:10], 1) if doc in relevant]
    return 1.0 / ranks[0] if ranks else 0.0


def reference(qrels, run) -> dict[str, dict[str, float]]:
    """metric -> {query: value x 100} for every query with a relevant document."""
    measures = {
        "ndcg@10": reference_ndcg_at_10,
        "map@100": reference_ap_at_100,
        "recall@1": lambda j, h: reference_recall(j, h, 1),
        "recall@10": lambda j, h: reference_recall(j, h, 10),
        "recall@100": lambda j, h: reference_recall(j, h, 100),
        "mrr@10": reference_rr_at_10,
    }
    queries = [q for q, judged in qrels.items() if _relevant(judged)]
    return {
        name: {q: 100 * measure(qrels[q], run.get(q, {})) for q in queries}
        for name, measure in measures.items()
    }


def assert_equal_to_reference(qrels, run):
    ours, expected = per_query_metrics(qrels, run), reference(qrels, run)
    assert list(ours) == list(METRICS)
    for metric in METRICS:
        assert ours[metric].keys() == expected[metric].keys(), metric
        for query, value in expected[metric].items():
            assert ours[metric][query] == pytest.approx(value, abs=1e-6), (metric, query)


def test_metrics_equal_the_reference_on_graded_qrels_ties_and_partial_runs():
    qrels = {
        "graded": {"a": 3, "b": 1, "c": 2, "x": 0},
        "none-retrieved": {"z": 1},
        "tied": {"a": 1, "m": 2},
        "all-zero": {"a": 0},  # no relevant document: not one of the queries
        "no-run": {"b": 1},  # absent from the run: counts 0
        "short": {"k": 1, "j": 1},
    }
    run = {
        "graded": {"x": 0.9, "b": 0.8, "q": 0.7, "a": 0.6, "c": 0.1},
        "none-retrieved": {"a": 0.5, "b": 0.4},
        "tied": {"a": 0.5, "m": 0.5, "b": 0.5, "z": 0.5},  # trec_eval: z, m, b, a
        "all-zero": {"a": 1.0},
        "short": {"j": 0.3},
        "not-judged": {"a": 1.0},
    }
    assert_equal_to_reference(qrels, run)
    ours = per_query_metrics(qrels, run)
    assert set(ours["ndcg@10"]) == {"graded", "none-retrieved", "tied", "no-run", "short"}
    assert ours["mrr@10"]["tied"] == 50.0  # m at rank 2: ties broken by id descending
    assert ours["recall@10"]["short"] == 50.0
    means = retrieval_metrics(qrels, run)
    # graded: b at 2; none-retrieved and no-run: 0; tied: m at 2; short: j at 1.
    assert means["mrr@10"] == pytest.approx((50 + 0 + 50 + 0 + 100) / 5)


def test_metrics_equal_the_reference_on_a_random_run():
    rng = random.Random(7)
    docs = [f"doc{i}" for i in range(300)]
    qrels, run = {}, {}
    for q in range(40):
        query = f"query{q}"
        judged = rng.sample(docs, rng.randint(1, 30))
        qrels[query] = {d: rng.choice([0, 1, 1, 2, 3]) for d in judged}
        if q % 9 == 0:
            continue  # no hits at all
        pool = rng.sample(docs, 150) if q % 2 else rng.sample(judged, len(judged) // 2)
        # Two decimals: many tied scores, at the 10 and 100 cut-offs too.
        run[query] = {d: round(rng.random(), 2) for d in pool}
    assert_equal_to_reference(qrels, run)


# --- search -----------------------------------------------------------------------------------


def _split(corpus_texts, query_texts, corpus_ids=None, query_ids=None) -> RetrievalSplit:
    corpus_ids = corpus_ids or [f"d{i}" for i in range(len(corpus_texts))]
    query_ids = query_ids or [f"q{i}" for i in range(len(query_texts))]
    return RetrievalSplit("test", corpus_ids, corpus_texts, query_ids, query_texts, {})


def brute_force(encode, split: RetrievalSplit, top_k: int) -> dict[str, list[str]]:
    """Every (query, document) cosine in float64, ranked by (score, id) descending."""
    q = encode(split.query_texts).astype(np.float64)
    c = encode(split.corpus_texts).astype(np.float64)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    c /= np.linalg.norm(c, axis=1, keepdims=True)
    out = {}
    for i, query in enumerate(split.query_ids):
        hits = [(float(q[i] @ c[j]), doc) for j, doc in enumerate(split.corpus_ids) if doc != query]
        # Identical texts give identical vectors: their ties are exact.
        out[query] = [doc for _, doc in sorted(hits, reverse=True)[:top_k]]
    return out


def test_sharded_search_equals_one_shot_search_and_the_brute_force_ranking():
    rng = random.Random(3)
    distinct = [f"text {i}" for i in range(9)]
    # Few distinct texts: exact ties everywhere, at the top-k boundary too.
    corpus = [rng.choice(distinct) for _ in range(41)]
    split = _split(corpus, ["text 1", "text 4", "something else", "text 8"])
    encode = hashed_encoder()
    one_shot = search(encode, split, top_k=7, shard_size=50_000)
    assert search(encode, split, top_k=7, shard_size=3) == one_shot  # scores bit for bit
    assert {q: list(hits) for q, hits in one_shot.items()} == brute_force(encode, split, 7)
    for hits in one_shot.values():
        ranked = list(hits.items())
        assert len(ranked) == 7
        assert ranked == sorted(ranked, key=lambda h: (h[1], h[0]), reverse=True)


def test_a_hit_with_the_query_id_is_dropped():
    """BEIR's ignore_identical_ids: the document that is the query itself is not a hit."""
    split = _split(
        ["alpha", "beta", "gamma", "alpha"],
        ["alpha", "beta"],
        corpus_ids=["a", "b", "c", "a2"],
        query_ids=["a", "x"],
    )
    for shard_size in (1, 2, 50_000):
        run = search(hashed_encoder(), split, top_k=2, shard_size=shard_size)
        assert "a" not in run["a"] and list(run["a"])[0] == "a2"  # the same text, another id
        assert list(run["x"])[0] == "b"
        assert len(run["a"]) == len(run["x"]) == 2


def test_evaluate_split_end_to_end_with_a_fake_encoder(tmp_path):
    directory = str(write_beir(tmp_path))
    encode = hashed_encoder()
    result = evaluate_split(encode, directory, "test", top_k=100)
    assert (result["split"], result["n_queries"], result["n_corpus"]) == ("test", 2, 4)
    split = read_split(directory, "test")
    run = search(encode, split)
    assert "q2" not in run["q2"]  # q2's only relevant document is itself: dropped
    assert result["per_query"] == per_query_metrics(split.qrels, run)
    assert result["metrics"] == retrieval_metrics(split.qrels, run)
    assert result["metrics"]["recall@100"] == 50.0  # q1 finds d1 among 3 hits, q2 nothing
    # Both splits in one pass over the corpus give each split's own result.
    together = evaluate_splits(encode, directory, ["dev", "test"])
    assert together["test"] == result
    assert together["dev"] == evaluate_split(encode, directory, "dev")


def test_near_ties_a_float32_product_cannot_separate_are_decided_by_the_exact_scores():
    """Documents a hair apart (score gaps ~1e-8, below float32's rounding): the hits are those
    of the exact float64 scores of the unit-length float32 vectors, in any shard size."""
    rng = np.random.default_rng(0)
    base = rng.normal(size=384)
    vectors = {f"doc {i}": base + 1e-6 * rng.normal(size=384) for i in range(300)}
    vectors |= {f"query {i}": base + 1e-3 * rng.normal(size=384) for i in range(10)}
    encode = lambda texts: np.stack([vectors[t] for t in texts]).astype(np.float32)  # noqa: E731
    split = _split([f"doc {i}" for i in range(300)], [f"query {i}" for i in range(10)])

    def unit(texts):
        x = encode(texts)
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float64)

    queries, docs = unit(split.query_texts), unit(split.corpus_texts)
    for top_k, shard_size in [(1, 50_000), (3, 7), (10, 64)]:
        run = search(encode, split, top_k=top_k, shard_size=shard_size)
        for i, query in enumerate(split.query_ids):
            exact = (queries[i] * docs).sum(axis=1)  # (300,) float64
            ranked = sorted(zip(exact.tolist(), split.corpus_ids), reverse=True)[:top_k]
            assert list(run[query]) == [doc for _, doc in ranked], (query, top_k)
