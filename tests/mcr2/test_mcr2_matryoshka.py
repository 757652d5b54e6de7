"""The opt-in Matryoshka baseline: the fine-tuned encoder's truncated vectors learn the pairs."""

from __future__ import annotations

import numpy as np

from distributed_emb.mcr2.matryoshka import MatryoshkaConfig, train_matryoshka, truncate

ANCHORS = ["red apple", "blue sky", "green grass", "old house", "fast car", "cold rain"]
POSITIVES = ["seven", "tuesday", "violin", "pencil", "river", "mountain"]  # arbitrary matches


def _top1(model, dim: int) -> float:
    """In-batch retrieval accuracy of the pairs with vectors cut to `dim` (cosine)."""
    a, p = (truncate(model.encode(texts), dim) for texts in (ANCHORS, POSITIVES))
    a /= np.linalg.norm(a, axis=1, keepdims=True)
    p /= np.linalg.norm(p, axis=1, keepdims=True)
    return float(np.mean((a @ p.T).argmax(1) == np.arange(len(ANCHORS))))


def test_matryoshka_fine_tuning_makes_the_truncated_vectors_retrieve_their_pairs(
    tmp_path, tiny_bert_path
):
    from sentence_transformers import SentenceTransformer

    from distributed_emb.model.sentence_transformer import load_sentence_transformer

    before = load_sentence_transformer(tiny_bert_path, pooler="mean", max_seq_length=16)
    config = MatryoshkaConfig(steps=60, batch_size=6, learning_rate=3e-3)
    trained = train_matryoshka(
        tiny_bert_path, "mean", 16, ANCHORS, POSITIVES, [4, 8], config, tmp_path / "m"
    )
    assert trained.dims == [4, 8, 32] and len(trained.losses) == 60
    assert np.isfinite(trained.losses).all()
    after = SentenceTransformer(trained.path, device="cpu")  # a plain ST directory
    assert after.encode(["x"]).shape == (1, 32)
    assert _top1(before, 4) < 1.0  # the random encoder does not know these pairs ...
    assert _top1(after, 4) == 1.0  # ... the first 4 dims of the fine-tuned one do
    assert np.mean(trained.losses[-10:]) < np.mean(trained.losses[:10])
