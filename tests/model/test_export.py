import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer
from transformers import AutoTokenizer

from distributed_emb.model.embedder import embed_module
from distributed_emb.model.encoder import TrainableEncoder
from distributed_emb.model.export import export_sentence_transformer

SENTENCES = ["A man is playing a guitar.", "Two dogs run.", "The stock market fell sharply today."]


@pytest.mark.parametrize(
    "pooler, mlp_head, include_mlp",
    [("mean", True, False), ("cls_before_pooler", True, True), ("cls", False, False)],
)
def test_exported_model_embeds_exactly_like_the_encoder(
    tiny_bert_path, tmp_path, pooler, mlp_head, include_mlp
):
    torch.manual_seed(0)
    encoder = TrainableEncoder(tiny_bert_path, pooler=pooler, mlp_head=mlp_head)
    with torch.no_grad():  # move away from the initial weights, as training would
        for p in encoder.parameters():
            p.add_(0.01 * torch.randn_like(p))
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_path)
    expected = embed_module(encoder, tokenizer, SENTENCES, 32, include_mlp=include_mlp)
    out = export_sentence_transformer(encoder, tokenizer, str(tmp_path / "m"), 32, include_mlp)
    got = SentenceTransformer(out, device="cpu").encode(SENTENCES)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    if include_mlp:  # the head really is in the export
        without = embed_module(encoder, tokenizer, SENTENCES, 32, include_mlp=False)
        assert not np.allclose(got, without, atol=1e-3)


def test_unused_hf_pooler_is_dropped_and_cls_keeps_it(tiny_bert_path):
    # Unused parameters would make DDP wait forever for their gradients.
    assert TrainableEncoder(tiny_bert_path, pooler="mean").backbone.pooler is None
    assert TrainableEncoder(tiny_bert_path, pooler="cls").backbone.pooler is not None


def test_a_model_that_started_normalised_exports_normalised(tiny_bert_path, tmp_path, minilm_path):
    from distributed_emb.model.sentence_transformer import ends_with_normalize

    assert ends_with_normalize(minilm_path)  # all-MiniLM-L6-v2 ends with Normalize
    assert not ends_with_normalize(tiny_bert_path)  # a plain HF dir does not
    encoder = TrainableEncoder(tiny_bert_path, pooler="mean", mlp_head=True)
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_path)
    expected = embed_module(encoder, tokenizer, SENTENCES, 32)
    expected = expected / np.linalg.norm(expected, axis=1, keepdims=True)
    out = export_sentence_transformer(encoder, tokenizer, str(tmp_path / "m"), 32, normalize=True)
    assert ends_with_normalize(out)
    got = SentenceTransformer(out, device="cpu").encode(SENTENCES)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
