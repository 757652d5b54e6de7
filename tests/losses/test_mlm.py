import math

import torch

from distributed_emb.losses.mlm import mlm_loss


def test_mean_over_masked_tokens_only():
    logits = torch.zeros(1, 3, 4)
    logits[0, 0, 2] = math.log(3.0)  # p(2) = 3/6 at position 0
    labels = torch.tensor([[2, -100, 1]])
    # position 0: -log(3/6); position 2: uniform -log(1/4)
    expected = (-math.log(0.5) - math.log(0.25)) / 2
    assert abs(float(mlm_loss(logits, labels)) - expected) < 1e-6


def test_no_masked_token_gives_connected_zero():
    logits = torch.randn(2, 3, 5, requires_grad=True)
    loss = mlm_loss(logits, torch.full((2, 3), -100))
    loss.backward()
    assert float(loss) == 0.0 and logits.grad is not None
