"""train.compile: the compiled encoder computes what the eager one does, padding and all."""

from __future__ import annotations

import pytest
import torch

from distributed_emb.config import TrainingConfig, load_config
from distributed_emb.model.encoder import TrainableEncoder
from distributed_emb.train.worker import build_encoder


def _batch(length: int, rows: int = 6, vocab: int = 1000) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(length)
    input_ids = torch.randint(5, vocab, (rows, length), generator=generator)
    attention_mask = torch.ones(rows, length, dtype=torch.long)
    attention_mask[1, length // 2 :] = 0  # a shorter sentence: padding inside the batch too
    return {"input_ids": input_ids, "attention_mask": attention_mask}


@pytest.mark.slow  # compiling a tiny BERT takes a minute on 2 cores
@pytest.mark.parametrize("pooler", ["mean", "cls_before_pooler"])
def test_compiled_encoder_matches_eager_vectors_and_gradients(cpp_compiler, tiny_bert_path, pooler):
    torch.manual_seed(0)
    eager = TrainableEncoder(tiny_bert_path, pooler=pooler).eval()  # eval: no dropout
    compiled = TrainableEncoder(tiny_bert_path, pooler=pooler).eval()
    compiled.load_state_dict(eager.state_dict())
    compiled.compile_backbone(pad_to_multiple_of=8)
    for length in (13, 16):  # 13 is padded to 16 inside; 16 is not padded
        batch = _batch(length)
        expected, got = eager(**batch), compiled(**batch)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
        expected.pow(2).sum().backward()
        got.pow(2).sum().backward()
    gradients = dict(compiled.named_parameters())
    for name, parameter in eager.named_parameters():
        if parameter.grad is not None:
            torch.testing.assert_close(gradients[name].grad, parameter.grad, rtol=1e-3, atol=1e-5)
    # Compiling in place keeps the parameter names, so checkpoints and exports are unchanged.
    assert compiled.state_dict().keys() == eager.state_dict().keys()


def test_padding_for_the_compiled_graph_is_masked_and_cut_back(tiny_bert_path):
    """The padding path without compiling: 13 tokens run as 16 and come back as 13."""
    torch.manual_seed(0)
    encoder = TrainableEncoder(tiny_bert_path, pooler="mean").eval()
    batch = _batch(13)
    expected = encoder(**batch)
    seen = []
    encoder.backbone.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    encoder.pad_to_multiple_of = 8
    torch.testing.assert_close(encoder(**batch), expected, rtol=1e-5, atol=1e-6)
    assert seen == [16]


def test_train_compile_compiles_the_trained_encoder(tiny_bert_path):
    overrides = [f"model.path={tiny_bert_path}"]
    plain_config = load_config(TrainingConfig, None, overrides)
    plain = build_encoder(plain_config.model, plain_config.loss, plain_config.train)
    assert plain.pad_to_multiple_of is None
    compiled_config = load_config(TrainingConfig, None, [*overrides, "train.compile=true"])
    compiled = build_encoder(compiled_config.model, compiled_config.loss, compiled_config.train)
    assert compiled.pad_to_multiple_of == 8
    assert compiled.backbone._compiled_call_impl is not None  # nn.Module.compile() was called
