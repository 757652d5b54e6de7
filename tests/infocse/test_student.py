"""The k-layer student: the source's first k layers, pooled as the source pools."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distributed_emb.infocse.student import build_layer_student

SENTENCES = ["A man is playing a guitar.", "The stock market fell sharply today.", "Hi."]


def _mean_pool_hidden_state(model_path: str, layer: int) -> np.ndarray:
    """Reference: the full model's hidden state after `layer` layers, mean-pooled by hand."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModel.from_pretrained(model_path).eval()
    batch = tokenizer(SENTENCES, padding=True, truncation=True, max_length=32,
                      return_tensors="pt")  # fmt: skip
    with torch.no_grad():
        hidden = model(**batch, output_hidden_states=True).hidden_states[layer]  # (B, T, d)
    mask = batch["attention_mask"].unsqueeze(-1).float()  # (B, T, 1)
    return ((hidden * mask).sum(1) / mask.sum(1)).numpy()  # (B, d)


def test_student_equals_the_sources_first_k_layers(tmp_path, tiny_bert_path):
    from transformers import AutoConfig

    from distributed_emb.model.embedder import Embedder

    student = build_layer_student(
        tiny_bert_path, 1, str(tmp_path / "student"), pooler="mean", max_seq_length=32
    )
    assert AutoConfig.from_pretrained(student).num_hidden_layers == 1
    embedded = Embedder(student, device="cpu").embed(SENTENCES)  # as saved: its own pooling
    np.testing.assert_allclose(embedded, _mean_pool_hidden_state(tiny_bert_path, 1),
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    # The full source differs (the top layer is gone), so the comparison has teeth.
    assert not np.allclose(embedded, _mean_pool_hidden_state(tiny_bert_path, 2), atol=1e-3)


def test_student_of_the_packaged_minilm_keeps_its_pooling_and_normalisation(tmp_path, minilm_path):
    from distributed_emb.model.embedder import Embedder

    student = build_layer_student(minilm_path, 3, str(tmp_path / "student"))
    embedded = Embedder(student, device="cpu").embed(SENTENCES)
    reference = _mean_pool_hidden_state(minilm_path, 3)
    reference /= np.linalg.norm(reference, axis=1, keepdims=True)  # MiniLM's Normalize module
    np.testing.assert_allclose(embedded, reference, rtol=1e-4, atol=1e-5)
    # Trainable by the core trainer's encoder: AutoModel reads 3 layers back.
    from distributed_emb.model.encoder import TrainableEncoder

    assert len(TrainableEncoder(student, pooler="mean").backbone.encoder.layer) == 3


def test_layer_count_out_of_range_is_an_error(tmp_path, tiny_bert_path):
    with pytest.raises(ValueError, match="num_layers must be in 1..2"):
        build_layer_student(tiny_bert_path, 3, str(tmp_path / "s"), pooler="mean")
