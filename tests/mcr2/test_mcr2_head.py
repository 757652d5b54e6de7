"""The compression head: shapes, unit rows, and an export view equal to its forward pass."""

from __future__ import annotations

import pytest
import torch

from distributed_emb.mcr2.head import CompressionHead


@pytest.mark.parametrize("hidden", [(), (16,), (16, 12)])
def test_head_outputs_unit_rows_of_the_requested_size(hidden):
    torch.manual_seed(0)
    head = CompressionHead(10, 4, hidden_dims=hidden, activation="tanh")
    z = head(torch.randn(7, 10))
    assert z.shape == (7, 4)
    torch.testing.assert_close(z.norm(dim=1), torch.ones(7))
    assert len(head.linears) == len(hidden) + 1


def test_export_layers_reproduce_forward():
    torch.manual_seed(1)
    head = CompressionHead(10, 3, hidden_dims=(8, 6), activation="gelu", dropout=0.3).eval()
    x = torch.randn(5, 10)
    y = x
    for linear, activation in head.layers_for_export():
        y = linear(y)
        if activation is not None:
            y = activation(y)
    torch.testing.assert_close(torch.nn.functional.normalize(y, dim=1), head(x))


def test_dropout_only_acts_in_training():
    torch.manual_seed(2)
    head = CompressionHead(10, 3, hidden_dims=(32,), dropout=0.5)
    x = torch.randn(4, 10)
    assert not torch.allclose(head.train()(x), head.train()(x))
    torch.testing.assert_close(head.eval()(x), head.eval()(x))


def test_bad_head_settings_are_named():
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        CompressionHead(4, 2, activation="swish")
    with pytest.raises(ValueError, match="positive"):
        CompressionHead(4, 0)
    with pytest.raises(ValueError, match="dropout"):
        CompressionHead(4, 2, dropout=1.0)
