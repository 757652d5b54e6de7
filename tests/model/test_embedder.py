"""Ray Data encoding returns exactly the in-process embeddings, in input order."""

from __future__ import annotations

import numpy as np
import pytest

from distributed_emb.model.embedder import (
    Embedder,
    EmbeddingLookup,
    default_cpus_per_actor,
    local_encode,
    make_encoder,
    ray_encode,
    use_encoding_pool,
)

# Lengths vary so that the length sort inside ray_encode really reorders the rows.
SENTENCES = [
    f"sentence number {i} " + "with some extra words " * (i % 7) + ("!" if i % 3 else "?")
    for i in range(150)
]


def test_embedder_adds_embedding_column_and_keeps_other_columns(tiny_bert_path):
    embedder = Embedder(tiny_bert_path, pooler="mean", batch_size=4, text_column="t")
    batch = {"t": np.array(["a cat", "a dog sat"]), "doc_id": np.array([7, 9])}
    out = embedder(batch)
    assert out["embedding"].shape == (2, 32)
    assert out["doc_id"].tolist() == [7, 9]
    with pytest.raises(KeyError, match="text column"):
        embedder({"text": np.array(["x"])})


def test_cpu_share_leaves_one_cpu_for_reads():
    assert default_cpus_per_actor(1, 2.0) == 1.0
    assert default_cpus_per_actor(2, 2.0) == 0.5
    assert default_cpus_per_actor(4, 2.0) == 0.25
    assert default_cpus_per_actor(2, 16.0) == 1.0


@pytest.mark.ray
@pytest.mark.parametrize("concurrency", [1, 2])
def test_ray_encode_equals_local_encode(tiny_bert_path, ray_local, concurrency):
    expected = local_encode(SENTENCES, tiny_bert_path, pooler="mean", batch_size=16)
    got = ray_encode(
        SENTENCES,
        tiny_bert_path,
        pooler="mean",
        batch_size=16,
        concurrency=concurrency,
        num_cpus_per_actor=0.5,
    )
    assert got.shape == expected.shape == (len(SENTENCES), 32)
    # Same model, same batches up to padding: equal up to float noise, row for row.
    np.testing.assert_allclose(got, expected, atol=1e-5)
    # Rows are distinct, so a permuted result could not pass the check above by accident.
    assert np.unique(expected.round(4), axis=0).shape[0] == len(SENTENCES)


@pytest.mark.parametrize(
    ("use_ray", "concurrency", "address", "env", "pool"),
    [
        ("auto", 1, None, None, False),  # one machine, one actor: this process, every core
        ("auto", 2, None, None, True),  # several actors asked for
        ("auto", 1, "10.0.0.1:6379", None, True),  # a cluster to join (ray.address)
        ("auto", 1, None, "http://127.0.0.1:8265", True),  # under `ray job submit`
        (True, 1, None, None, True),
        (False, 4, "10.0.0.1:6379", None, False),
    ],
)
def test_encoding_pool_where_it_pays(monkeypatch, use_ray, concurrency, address, env, pool):
    if env is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", env)
    assert use_encoding_pool(use_ray, concurrency, address) is pool


def test_make_encoder_rejects_ray_options_without_ray(tiny_bert_path):
    with pytest.raises(ValueError, match="Ray options"):
        make_encoder(tiny_bert_path, use_ray=False, concurrency=2)


def test_embedding_lookup_encodes_each_distinct_sentence_once():
    calls = []

    def encode(sentences):
        calls.append(list(sentences))
        return np.array([[len(s), 1.0] for s in sentences])

    lookup = EmbeddingLookup.encode_all(["aa", "b", "aa", "cccc"], encode)
    assert calls == [["aa", "b", "cccc"]]
    assert lookup(["cccc", "aa", "aa"]).tolist() == [[4, 1], [2, 1], [2, 1]]
    with pytest.raises(KeyError, match="not encoded"):
        lookup(["zz"])


def test_embedding_lookup_extend_embeds_only_new_sentences():
    calls = []

    def encode(sentences):
        calls.append(list(sentences))
        return np.array([[len(s), 0.0] for s in sentences])

    lookup = EmbeddingLookup([], np.zeros((0, 0)))
    assert lookup.extend(["a", "bb", "a"], encode) == 2
    assert lookup.extend(["bb", "ccc"], encode) == 1
    assert lookup.extend(["ccc"], encode) == 0
    assert calls == [["a", "bb"], ["ccc"]]
    assert lookup(["ccc", "a", "bb"]).tolist() == [[3, 0], [1, 0], [2, 0]]
