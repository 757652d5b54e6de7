"""The per-shard faiss indexes: their files and index.json, their recall against exact search
on a real embedded corpus, and the Ray build (one task per shard)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from embedding_outputs import embedded_news, unit, write_embedding_output, write_news_output

from distributed_emb.vectors.ann_index import (
    build_index,
    load_shard_index,
    read_index_info,
    search_index,
)
from distributed_emb.vectors.index_config import IndexConfig
from distributed_emb.vectors.search import index_recall, recall_at_k, search, without_own_row
from distributed_emb.vectors.shard_layout import ShardLayoutError, read_manifest


@pytest.fixture(scope="module")
def news_index(minilm_path, tmp_path_factory):
    """The embedded news rows (3 shards) with an HNSW index at the default settings."""
    out = write_news_output(tmp_path_factory.mktemp("news_index"), minilm_path)
    build_index(str(out), IndexConfig(kind="hnsw"), use_ray=False)
    return out


def test_hnsw_recall_at_10_on_the_embedded_news_corpus(news_index, minilm_path):
    """The index finds ≥ 95% of each row's 10 nearest other rows that an exact scan finds,
    with 500 corpus rows as queries (MiniLM embeddings of the shipped news corpus)."""
    _, _, seconds = embedded_news(minilm_path)
    manifest = read_manifest(str(news_index))
    recall = index_recall(manifest, sample=500, k=10, seed=0)
    print(f"\nembedding {manifest.rows} news rows took {seconds:.1f} s; recall@10 {recall:.4f}")
    assert recall >= 0.95


def test_index_files_follow_the_layout(tmp_path):
    """One part-<first_id>.faiss per shard, named like its shard, and index.json with the
    kind, parameters, dim and metric; kind=auto gives small shards a flat index."""
    rng = np.random.default_rng(0)
    write_embedding_output(tmp_path, unit(rng.normal(size=(120, 16))), shards=3)
    settings = IndexConfig(kind="auto", flat_below_rows=41, hnsw_m=8)
    build_index(str(tmp_path), settings, use_ray=False)
    manifest = read_manifest(str(tmp_path))
    tree = json.loads((tmp_path / "index" / "index.json").read_text())
    assert (tree["kind"], tree["dim"], tree["metric"]) == ("auto", 16, "ip")
    assert tree["parameters"]["hnsw_m"] == 8
    assert [s["shard"] for s in tree["shards"]] == [s.file for s in manifest.shards]
    assert [s["file"] for s in tree["shards"]] == [
        s.file.replace("shards/", "index/").replace(".parquet", ".faiss") for s in manifest.shards
    ]
    assert [s["kind"] for s in tree["shards"]] == ["flat", "flat", "flat"]  # 40 rows each
    settings.flat_below_rows = 40
    info = build_index(str(tmp_path), settings, use_ray=False)
    assert [s.kind for s in info.shards] == ["hnsw", "hnsw", "hnsw"]


def test_an_index_row_is_its_shard_row(tmp_path):
    """Label i of a shard's index is row i of that shard: each row finds itself."""
    rng = np.random.default_rng(1)
    vectors = unit(rng.normal(size=(90, 16)))
    write_embedding_output(tmp_path, vectors, shards=3)
    info = build_index(str(tmp_path), IndexConfig(kind="hnsw"), use_ray=False)
    index = load_shard_index(info, 1)
    scores, rows = search_index(index, vectors[30:60], k=1)
    assert np.array_equal(rows[:, 0], np.arange(30))
    assert np.allclose(scores[:, 0], 1.0, atol=1e-5)
    # Past the shard's end: row −1, score −inf.
    scores, rows = search_index(index, vectors[:1], k=40)
    assert (rows[0, 30:] == -1).all() and np.isneginf(scores[0, 30:]).all()


def test_a_stale_or_missing_index_is_refused(tmp_path):
    rng = np.random.default_rng(2)
    write_embedding_output(tmp_path, unit(rng.normal(size=(30, 8))), shards=3)
    with pytest.raises(ShardLayoutError, match=r"index/index.json: missing: no index"):
        read_index_info(read_manifest(str(tmp_path)))
    build_index(str(tmp_path), IndexConfig(), use_ray=False)
    write_embedding_output(tmp_path, unit(rng.normal(size=(33, 8))), shards=3)  # written again
    with pytest.raises(ShardLayoutError, match=r"index.json: built for other shards"):
        read_index_info(read_manifest(str(tmp_path)))
    info = build_index(str(tmp_path), IndexConfig(), use_ray=False)  # rebuilt: current again
    assert read_index_info(read_manifest(str(tmp_path))).shards == info.shards
    (tmp_path / "index" / "part-000000000007.faiss").write_bytes(b"not an index")
    with pytest.raises(ShardLayoutError, match=r"part-000000000007.faiss: not a readable faiss"):
        load_shard_index(info, 0)


def test_binary_shards_get_binary_indexes_whose_rescored_hits_match_a_reference(tmp_path):
    """ubinary shards: one faiss binary index per shard (flat or HNSW by kind=auto), metric
    "hamming" in index.json; a hit's score is the float query against the row's ±1 vector
    (computed here in numpy), and each row's own float vector finds that row first (sign(q)
    maximises q·s over every ±1 vector s)."""
    rng = np.random.default_rng(4)
    vectors = unit(rng.normal(size=(150, 64)))
    write_embedding_output(tmp_path, vectors, shards=3, dtype="ubinary")
    settings = IndexConfig(kind="auto", flat_below_rows=50, hnsw_m=8)
    info = build_index(str(tmp_path), settings, use_ray=False)
    tree = json.loads((tmp_path / "index" / "index.json").read_text())
    assert (tree["metric"], tree["dim"]) == ("hamming", 64)
    assert [s.kind for s in info.shards] == ["hnsw", "hnsw", "hnsw"]  # 50 rows each
    manifest = read_manifest(str(tmp_path))
    found = search(manifest, vectors, k=3)
    assert np.array_equal(found.ids[:, 0], np.arange(150) * 10 + 7)
    signs = np.where(vectors > 0, 1.0, -1.0) / np.sqrt(64)  # the stored bits as ±1 rows
    reference = vectors @ signs.T  # (150, 150): every query against every row
    rows = (found.ids - 7) // 10
    assert np.allclose(found.scores, np.take_along_axis(reference, rows, axis=1), atol=1e-5)
    exact = search(manifest, vectors, k=3, exact=True)
    best = np.sort(reference, axis=1)[:, ::-1][:, :3]
    assert np.allclose(exact.scores, best, atol=1e-5)


def test_binary_index_recall_at_10_on_the_embedded_news_corpus(minilm_path, tmp_path):
    """The news rows stored as bits, one HNSW binary index per shard: Hamming candidates,
    rescored, find ≥ 90% of the 10 best rows an exact rescored scan of the same bits finds,
    with the rows' own bits as queries (what --recall reports) and with float queries. What
    the bits lose against the float vectors is printed, not bounded: it is the model's."""
    texts, vectors, _ = embedded_news(minilm_path)
    floats, bits = tmp_path / "float32", tmp_path / "ubinary"
    write_embedding_output(floats, vectors, texts=texts)
    write_embedding_output(bits, vectors, texts=texts, dtype="ubinary")
    build_index(str(bits), IndexConfig(kind="hnsw"), use_ray=False)
    binary = read_manifest(str(bits))
    own_bits = index_recall(binary, sample=300, k=10, seed=0)
    picked = np.random.default_rng(0).choice(len(vectors), size=300, replace=False)
    queries, own = vectors[picked], picked * 10 + 7

    def top10(manifest, exact):
        return without_own_row(search(manifest, queries, 11, exact=exact).ids, own, 10)

    exact_bits, indexed_bits = top10(binary, True), top10(binary, False)
    exact_floats = top10(read_manifest(str(floats)), True)
    float_queries = recall_at_k(indexed_bits, exact_bits)
    print(
        f"\nbinary index recall@10 against the exact binary scan: {own_bits:.4f} (queries: the "
        f"rows' bits), {float_queries:.4f} (float queries); against exact float search: "
        f"binary scan {recall_at_k(exact_bits, exact_floats):.4f}, "
        f"binary index {recall_at_k(indexed_bits, exact_floats):.4f}"
    )
    assert own_bits >= 0.90 and float_queries >= 0.90


def test_built_as_ray_tasks_the_index_answers_as_built_here(ray_local, tmp_path):
    """One Ray task per shard writes the indexes: searches agree with an in-process build's
    and with exact search (100-row shards: HNSW at efSearch 128 finds the true top 5)."""
    rng = np.random.default_rng(3)
    vectors = unit(rng.normal(size=(300, 16)))
    here, there = tmp_path / "here", tmp_path / "there"
    for out in (here, there):
        write_embedding_output(out, vectors, shards=3)
    build_index(str(here), IndexConfig(kind="hnsw"), use_ray=False)
    info = build_index(str(there), IndexConfig(kind="hnsw"), use_ray=True)
    assert [s.rows for s in info.shards] == [100, 100, 100]
    queries = vectors[::7]
    local = search(read_manifest(str(here)), queries, k=5)
    remote = search(read_manifest(str(there)), queries, k=5)
    exact = search(read_manifest(str(here)), queries, k=5, exact=True)
    assert np.array_equal(local.ids, exact.ids) and np.array_equal(remote.ids, exact.ids)
    assert np.allclose(remote.scores, exact.scores, atol=1e-6)
