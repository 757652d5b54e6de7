"""The compression head: shapes, unit rows, and an export view equal to its forward pass."""

from __future__ import annotations

import typing

import numpy as np
import pytest
import torch

from distributed_emb.mcr2.baselines import fit_baseline, fit_pca_model
from distributed_emb.mcr2.compression_config import Activation
from distributed_emb.model.compression_head import ACTIVATIONS, CompressionHead


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


def test_the_config_declares_every_activation_of_the_head():
    assert set(typing.get_args(Activation)) == set(ACTIVATIONS)


def test_a_linear_head_started_at_pca_gives_the_pca_baselines_vectors():
    rng = np.random.default_rng(0)
    train = (rng.standard_normal((200, 12)) * np.linspace(3, 0.2, 12) + 5).astype(np.float32)
    pca = fit_pca_model(train, 4)
    head = CompressionHead(12, 4, hidden_dims=()).eval()
    head.start_at_projection(pca.mean_, pca.components_)
    x = rng.standard_normal((7, 12)).astype(np.float32) + 5
    expected = fit_baseline("pca", train, 4)(x)
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    with torch.no_grad():
        np.testing.assert_allclose(head(torch.from_numpy(x)).numpy(), expected, atol=1e-5)


def test_only_a_linear_head_of_the_right_shape_starts_at_a_projection():
    with pytest.raises(ValueError, match="only a linear head"):
        CompressionHead(12, 4, hidden_dims=(8,)).start_at_projection(
            np.zeros(12), np.zeros((4, 12))
        )
    with pytest.raises(ValueError, match="does not fit"):
        CompressionHead(12, 4, hidden_dims=()).start_at_projection(np.zeros(12), np.zeros((3, 12)))
