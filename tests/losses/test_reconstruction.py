import pytest
import torch

from distributed_emb.losses.reconstruction import reconstruction_loss


def test_squared_norm_is_the_papers_mean_squared_distance():
    z1 = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
    z2 = torch.tensor([[1.0, 0.0], [3.0, 4.0]])
    # rows: ‖(0, 2)‖² = 4, ‖(-3, -4)‖² = 25 → mean 14.5
    assert float(reconstruction_loss(z1, z2, "squared_norm")) == pytest.approx(14.5)


def test_normalized_mse_both_directions():
    z1 = torch.tensor([[2.0, 0.0], [0.0, 5.0]])
    z2 = torch.tensor([[0.0, 3.0], [0.0, 1.0]])
    # normalised: ([1,0] vs [0,1]) → squared error 2 over 2 elements; second row identical.
    # element mean over 4 elements = 2/4 = 0.5 per direction, summed over both = 1.0
    assert float(reconstruction_loss(z1, z2, "normalized_mse")) == pytest.approx(1.0)


def test_gradient_pulls_views_together():
    z1 = torch.randn(4, 3, requires_grad=True)
    z2 = torch.randn(4, 3)
    loss = reconstruction_loss(z1, z2, "squared_norm")
    loss.backward()
    assert torch.allclose(z1.grad, 2 * (z1 - z2).detach() / 4)


def test_unknown_form_is_rejected():
    with pytest.raises(ValueError, match="unknown reconstruction form"):
        reconstruction_loss(torch.zeros(1, 2), torch.zeros(1, 2), "l1")
