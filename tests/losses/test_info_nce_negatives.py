"""InfoNCE with hard negatives (data.negative_column): every anchor's candidates are the batch's
second views and the batch's negatives, (B, 2B) logits, written out here loop by loop."""

import math

import torch

from distributed_emb.losses.info_nce import info_nce_loss


def reference_with_negatives(z1, z2, negatives, tau, groups=None):
    """-log softmax of the positive among every second view (less the anchor's group's other
    rows) and every negative (never masked: their groups are not known)."""

    def cos(a, b) -> float:
        return float(a @ b / (a.norm() * b.norm()))

    total = 0.0
    n = z1.shape[0]
    for i in range(n):
        views = [
            cos(z1[i], z2[j]) / tau
            for j in range(n)
            if groups is None or j == i or groups[j] != groups[i]
        ]
        hard = [cos(z1[i], negatives[j]) / tau for j in range(n)]
        denominator = sum(math.exp(s) for s in views + hard)
        total += -(cos(z1[i], z2[i]) / tau - math.log(denominator))
    return total / n


def _embeddings(seed: int, rows: int = 6, dim: int = 5):
    torch.manual_seed(seed)
    return [torch.randn(rows, dim, dtype=torch.float64) for _ in range(3)]


def test_negatives_join_the_candidates_of_every_anchor():
    z1, z2, negatives = _embeddings(0)
    for gather in (True, False):  # one process: the gathered batch is the local one
        got = info_nce_loss(z1, z2, 0.05, gather=gather, negatives=negatives)
        assert abs(float(got) - reference_with_negatives(z1, z2, negatives, 0.05)) < 1e-9
    # More candidates: a larger denominator than the second views alone give.
    assert float(got) > float(info_nce_loss(z1, z2, 0.05))


def test_groups_mask_second_views_but_not_negatives():
    z1, z2, negatives = _embeddings(1)
    groups = torch.tensor([0, 0, 1, 2, 2, 2])
    got = info_nce_loss(z1, z2, 0.1, gather=True, groups=groups, negatives=negatives)
    expected = reference_with_negatives(z1, z2, negatives, 0.1, groups.tolist())
    assert abs(float(got) - expected) < 1e-9
    assert float(got) != float(info_nce_loss(z1, z2, 0.1, negatives=negatives))


def test_a_hard_negative_near_its_anchor_costs_more_than_a_far_one():
    z1, z2, far = _embeddings(2)
    near = z1 + 0.01 * torch.randn_like(z1)  # each anchor's negative almost the anchor itself
    assert float(info_nce_loss(z1, z2, 0.05, negatives=near)) > float(
        info_nce_loss(z1, z2, 0.05, negatives=far)
    )


def test_gradients_reach_the_negatives_and_match_the_reference_batch():
    """The gathered path's gradients (one process) equal autograd through the plain
    concatenated candidates: [z2; negatives] with the positive of row i at column i."""
    z1, z2, negatives = (t.requires_grad_() for t in _embeddings(3))
    info_nce_loss(z1, z2, 0.05, negatives=negatives).backward()
    got = [t.grad.clone() for t in (z1, z2, negatives)]
    for t in (z1, z2, negatives):
        t.grad = None
    candidates = torch.nn.functional.normalize(torch.cat([z2, negatives]), dim=-1)  # (2B, d)
    logits = torch.nn.functional.normalize(z1, dim=-1) @ candidates.T / 0.05  # (B, 2B)
    torch.nn.functional.cross_entropy(logits, torch.arange(len(z1))).backward()
    for value, tensor in zip(got, (z1, z2, negatives)):
        assert torch.allclose(value, tensor.grad, rtol=1e-9, atol=1e-12)
    assert float(got[2].abs().max()) > 0
