import math

import torch

from distributed_emb.losses.info_nce import info_nce_loss


def reference_info_nce(z1, z2, tau, groups=None):
    """Written out loop by loop: -log softmax of the positive among all candidates."""
    total = 0.0
    n = z1.shape[0]
    for i in range(n):
        sims = []
        for j in range(n):
            if groups is not None and j != i and groups[j] == groups[i]:
                continue
            cos = float(z1[i] @ z2[j] / (z1[i].norm() * z2[j].norm()))
            sims.append((j, cos / tau))
        denominator = sum(math.exp(s) for _, s in sims)
        positive = next(s for j, s in sims if j == i)
        total += -(positive - math.log(denominator))
    return total / n


def test_matches_reference():
    torch.manual_seed(0)
    z1, z2 = torch.randn(6, 5, dtype=torch.float64), torch.randn(6, 5, dtype=torch.float64)
    got = info_nce_loss(z1, z2, 0.05, gather=True)
    assert abs(float(got) - reference_info_nce(z1, z2, 0.05)) < 1e-9


def test_groups_remove_same_document_negatives():
    torch.manual_seed(1)
    z1, z2 = torch.randn(6, 4, dtype=torch.float64), torch.randn(6, 4, dtype=torch.float64)
    groups = torch.tensor([0, 0, 1, 2, 2, 2])
    got = info_nce_loss(z1, z2, 0.1, gather=False, groups=groups)
    assert abs(float(got) - reference_info_nce(z1, z2, 0.1, groups.tolist())) < 1e-9
    assert float(got) != float(info_nce_loss(z1, z2, 0.1, gather=False))


def test_identical_views_far_apart_give_low_loss():
    z = torch.eye(4)
    assert float(info_nce_loss(z, z, 0.05)) < 1e-6
