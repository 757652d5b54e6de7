"""Cluster assignments: ids from a user column, and a learned soft assignment that finds
the clusters a plain partition would give."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from distributed_emb.losses.mcr2 import compressed_coding_rate, soft_compressed_coding_rate
from distributed_emb.mcr2.assignments import SoftAssignmentHead, cluster_ids_from_column


def test_column_values_become_ids_in_order_of_first_appearance():
    ids, values = cluster_ids_from_column(["doc-b", "doc-a", "doc-b", 7, np.int64(7), "doc-a"])
    assert ids.tolist() == [0, 1, 0, 2, 2, 1]
    assert values == ["doc-b", "doc-a", 7]


def test_missing_cluster_value_names_column_and_row():
    with pytest.raises(ValueError, match=r"'label', row 2: missing value"):
        cluster_ids_from_column([1, 2, None], column="label")
    with pytest.raises(ValueError, match=r"row 0"):
        cluster_ids_from_column([float("nan")], column="label")


def test_soft_assignments_are_probabilities():
    head = SoftAssignmentHead(6, 4, temperature=0.5)
    pi = head(torch.randn(9, 6))
    assert pi.shape == (9, 4)
    assert (pi >= 0).all()
    torch.testing.assert_close(pi.sum(1), torch.ones(9))


def _three_planes(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """30 unit vectors near each of 3 orthogonal 2-D affine pieces in R¹²."""
    g = torch.Generator().manual_seed(seed)
    basis = torch.linalg.qr(torch.randn(12, 12, generator=g))[0]
    truth = torch.arange(3).repeat_interleave(30)
    coef = 0.5 * torch.randn(90, 2, generator=g)
    x = torch.stack(
        [
            basis[:, 3 * c] + coef[i, 0] * basis[:, 3 * c + 1] + coef[i, 1] * basis[:, 3 * c + 2]
            for i, c in enumerate(truth.tolist())
        ]
    )
    return torch.nn.functional.normalize(x, dim=1), truth


@pytest.mark.parametrize("seed", [0, 1])
def test_learned_assignment_recovers_the_planted_partition(seed):
    x, truth = _three_planes(seed)
    torch.manual_seed(seed)
    head = SoftAssignmentHead(12, 3)
    optimiser = torch.optim.Adam(head.parameters(), lr=0.05)
    for _ in range(200):
        loss = soft_compressed_coding_rate(x, head(x), eps=0.5)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    predicted = head(x).argmax(1)
    # Same partition up to renaming: each true cluster maps to one predicted cluster, bijectively.
    mapping = {int(t): set(predicted[truth == t].tolist()) for t in range(3)}
    assert all(len(v) == 1 for v in mapping.values()), mapping
    assert len(set.union(*mapping.values())) == 3
    # And the learned soft Π reaches the planted partition's R_c.
    planted = compressed_coding_rate(x, truth, eps=0.5).item()
    assert loss.item() == pytest.approx(planted, abs=0.05)


def test_bad_assignment_settings_are_named():
    with pytest.raises(ValueError, match="≥ 2 clusters"):
        SoftAssignmentHead(4, 1)
    with pytest.raises(ValueError, match="temperature"):
        SoftAssignmentHead(4, 3, temperature=0)
