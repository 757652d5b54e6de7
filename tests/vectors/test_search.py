"""Top-k across shards: the running merge against one array's top-k, recall@k, and
jobs/search.py end to end on the embedded news corpus."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from embedding_outputs import embedded_news, unit, write_embedding_output, write_news_output
from harness.jobs import run as run_job

from distributed_emb.vectors.ann_index import build_index
from distributed_emb.vectors.index_config import IndexConfig
from distributed_emb.vectors.search import RunningTopK, recall_at_k, search
from distributed_emb.vectors.shard_layout import read_manifest


def numpy_top_k(vectors: np.ndarray, queries: np.ndarray, k: int):
    """The plain reference: every score at once, sorted best first (lower row on a tie)."""
    scores = queries @ vectors.T  # (q, n)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(scores, order, axis=1)


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_exact_top_k_across_three_shards_is_one_arrays_top_k(tmp_path, dtype):
    rng = np.random.default_rng(0)
    vectors = unit(rng.normal(size=(500, 16)))
    ids = np.sort(rng.choice(10**9, size=500, replace=False))
    write_embedding_output(tmp_path, vectors, ids=ids, shards=3, dtype=dtype)
    manifest = read_manifest(str(tmp_path))
    if dtype == "int8":  # the reference compares what the shards hold: the dequantised rows
        from distributed_emb.vectors.shard_layout import iter_shards, unit_vectors

        vectors = np.concatenate([unit_vectors(s, manifest) for s in iter_shards(manifest)])
    queries = unit(rng.normal(size=(40, 16)))
    found = search(manifest, queries, k=10, exact=True)
    rows, scores = numpy_top_k(vectors, queries, 10)
    assert np.array_equal(found.ids, ids[rows])
    assert np.allclose(found.scores, scores, atol=1e-6)


def test_k_beyond_the_corpus_pads_with_no_row(tmp_path):
    vectors = unit(np.random.default_rng(1).normal(size=(7, 8)))
    write_embedding_output(tmp_path, vectors, shards=3)
    found = search(read_manifest(str(tmp_path)), vectors[:2], k=9, exact=True, with_text=True)
    assert (found.ids[:, 7:] == -1).all() and np.isneginf(found.scores[:, 7:]).all()
    assert sorted(found.ids[0, :7].tolist()) == (np.arange(7) * 10 + 7).tolist()
    assert found.texts.shape == (2, 9) and found.texts[0, 0] is None  # written without text


def test_running_top_k_is_the_top_k_of_everything_it_saw():
    rng = np.random.default_rng(2)
    scores = rng.normal(size=(5, 60)).astype(np.float32)
    keys = np.broadcast_to(np.arange(60), (5, 60))
    best = RunningTopK(5, 8)
    for part in np.array_split(rng.permutation(60), 4):  # any order, any cut
        best.add(scores[:, part], keys[:, part])
    expected = np.argsort(-scores, axis=1)[:, :8]
    assert np.array_equal(best.keys, expected)
    assert np.array_equal(best.scores, np.take_along_axis(scores, expected, axis=1))


def test_recall_at_k_counts_the_true_neighbours_found():
    exact = np.array([[1, 2, 3, 4], [5, 6, -1, -1]])
    approximate = np.array([[4, 9, 1, 8], [6, 5, 7, -1]])
    # 2 of 4, then 2 of the 2 rows there are.
    assert recall_at_k(approximate, exact) == pytest.approx((0.5 + 1.0) / 2)
    assert recall_at_k(approximate, exact, k=1) == pytest.approx((0.0 + 0.0) / 2)


@pytest.fixture(scope="module")
def news_output(minilm_path, tmp_path_factory):
    """The news output, the packaged MiniLM as its manifest's model; no index."""
    return write_news_output(tmp_path_factory.mktemp("news"), minilm_path)


@pytest.fixture(scope="module")
def indexed_news(news_output, tmp_path_factory):
    """The news output with an index."""
    out = tmp_path_factory.mktemp("indexed_news")
    shutil.copytree(news_output, out, dirs_exist_ok=True)
    build_index(str(out), IndexConfig(kind="hnsw"), use_ray=False)
    return out


def test_search_job_answers_queries_and_measures_recall(indexed_news, minilm_path, tmp_path):
    """A corpus sentence as the query finds itself first, through the manifest's model; the
    results are best first, with ids and texts from the shards; --recall is measured."""
    texts, _, _ = embedded_news(minilm_path)
    queries = tmp_path / "queries.jsonl"
    queries.write_text(json.dumps({"_id": "q1", "text": texts[1234]}) + "\n")
    results = tmp_path / "results.jsonl"
    status = run_job(
        "search",
        [str(indexed_news), "--query", texts[42], "--queries", str(queries), "-k", "5",
         "--recall", "--recall-sample", "200", "--output", str(results)],
    )  # fmt: skip
    assert status == 0
    first, second, recall = [json.loads(line) for line in results.read_text().splitlines()]
    for line, row in ((first, 42), (second, 1234)):
        assert len(line["results"]) == 5
        assert line["results"][0]["id"] == row * 10 + 7
        assert line["results"][0]["text"] == texts[row]
        scores = [hit["score"] for hit in line["results"]]
        assert scores == sorted(scores, reverse=True) and scores[0] == pytest.approx(1.0, abs=1e-4)
    assert second["query_id"] == "q1" and "query_id" not in first
    assert recall["queries"] == 200 and recall["recall@5"] >= 0.95


def test_search_job_refuses_output_without_an_index(news_output, capsys):
    status = run_job("search", [str(news_output), "--query", "stocks fell"])
    assert status == 2
    assert "index/index.json: missing: no index" in capsys.readouterr().err


def test_search_job_names_a_bad_query_line(indexed_news, tmp_path, capsys):
    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"text": "fine"}\n{"_id": 3}\n')
    assert run_job("search", [str(indexed_news), "--queries", str(queries)]) == 2
    assert f'{queries}:2: expected an object with a "text" string' in capsys.readouterr().err


def test_index_and_search_on_object_storage(s3, tmp_path):
    """OUT on s3://: the shards read, the indexes and index.json written there, and the
    search's answers those of the same output on a local disk."""
    from distributed_emb.storage import copy_to_storage

    rng = np.random.default_rng(4)
    vectors = unit(rng.normal(size=(90, 16)))
    write_embedding_output(tmp_path, vectors, texts=[f"row {i}" for i in range(90)], shards=3)
    out = copy_to_storage(tmp_path, s3.create_bucket("distributed-emb-vectors") + "/out")
    build_index(out, IndexConfig(kind="hnsw"), use_ray=False)
    keys = s3.keys("distributed-emb-vectors", "out/index/")
    assert sorted(key for key in keys if not key.endswith("/")) == [  # no directory markers
        "out/index/index.json",
        "out/index/part-000000000007.faiss",
        "out/index/part-000000000307.faiss",
        "out/index/part-000000000607.faiss",
    ]
    found = search(read_manifest(out), vectors[::9], k=4, with_text=True)
    rows, _ = numpy_top_k(vectors, vectors[::9], 4)
    assert np.array_equal(found.ids, rows * 10 + 7)
    assert found.texts[1, 0] == "row 9"


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--backend", "torch"], "embed.backend=onnx_int8; its queries must be embedded the same"),
        (["--model", "/some/model"], "--model does not apply"),
    ],
)
def test_search_refuses_a_query_backend_other_than_the_manifest_s(tmp_path, capsys, extra, named):
    """The corpus went through an int8 graph (the manifest says): queries embedded by the torch
    model, or by another model, are refused before anything loads, naming the manifest."""
    vectors = unit(np.random.default_rng(5).normal(size=(9, 8)))
    write_embedding_output(tmp_path, vectors, shards=1)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest.update(backend="onnx_int8", graph="graphs/0123456789abcdef", agreement={})
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert read_manifest(str(tmp_path)).backend == "onnx_int8"

    assert run_job("search", [str(tmp_path), "--exact", "--query", "stocks", *extra]) == 2
    error = capsys.readouterr().err
    assert named in error and str(tmp_path / "manifest.json") in error
    assert len(error.strip().splitlines()) == 1
