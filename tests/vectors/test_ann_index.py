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
from distributed_emb.vectors.search import index_recall, search
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


def test_binary_output_is_refused_with_a_reason(tmp_path):
    write_embedding_output(tmp_path, unit(np.eye(8)), shards=1)
    tree = json.loads((tmp_path / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps({**tree, "dtype": "ubinary"}))
    with pytest.raises(ShardLayoutError, match="dtype ubinary: the index compares float"):
        build_index(str(tmp_path), IndexConfig(), use_ray=False)


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
