"""MCR² loss against plain float64 references, its gradient, and its grouping."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from distributed_emb.losses.distillation import similarity_distillation_loss
from distributed_emb.losses.mcr2 import (
    MCR2Loss,
    MCR2LossConfig,
    coding_rate,
    compressed_coding_rate,
    soft_compressed_coding_rate,
)


def _normalised(n: int, d: int, seed: int) -> np.ndarray:
    z = np.random.default_rng(seed).standard_normal((n, d))
    return z / np.linalg.norm(z, axis=1, keepdims=True)


def reference_rate(z: np.ndarray, eps: float) -> float:
    n, d = z.shape
    sign, logdet = np.linalg.slogdet(np.eye(d) + d / (n * eps**2) * z.T @ z)
    assert sign > 0
    return 0.5 * logdet


def reference_compressed_rate(z: np.ndarray, ids: np.ndarray, eps: float) -> float:
    n, d = z.shape
    total = 0.0
    for k in np.unique(ids):
        zk = z[ids == k]
        nk = zk.shape[0]
        total += nk / (2 * n) * np.linalg.slogdet(np.eye(d) + d / (nk * eps**2) * zk.T @ zk)[1]
    return total


def dense_membership_rate(z: torch.Tensor, pi: torch.Tensor, eps: float) -> torch.Tensor:
    """The MCR² paper's own formulation: Π as k diagonal n×n matrices (k×n×n)."""
    n, d = z.shape
    dense = torch.diag_embed(pi.T)  # (k, n, n)
    total = z.new_zeros(())
    for pik in dense:
        tr = torch.trace(pik)
        total = total + tr / (2 * n) * torch.logdet(
            torch.eye(d, dtype=z.dtype) + d / (tr * eps**2) * z.T @ pik @ z
        )
    return total


@pytest.mark.parametrize("eps", [0.5, math.sqrt(0.5)])
def test_rates_match_float64_reference(eps):
    z = _normalised(40, 8, seed=0)
    ids = np.random.default_rng(1).integers(0, 5, size=40) * 7 + 3  # arbitrary id values
    zt = torch.from_numpy(z)
    assert coding_rate(zt, eps).item() == pytest.approx(reference_rate(z, eps), rel=1e-10)
    got = compressed_coding_rate(zt, torch.from_numpy(ids), eps).item()
    assert got == pytest.approx(reference_compressed_rate(z, ids, eps), rel=1e-10)


def test_float32_input_with_float64_compute_matches_reference():
    z = _normalised(64, 16, seed=2)
    ids = np.arange(64) % 6
    loss_fn = MCR2Loss(MCR2LossConfig(eps=0.5, pair_weight=0.0, compute_dtype="float64"))
    loss, metrics = loss_fn(torch.from_numpy(z).float(), torch.from_numpy(ids))
    expected = -reference_rate(z, 0.5) + reference_compressed_rate(z, ids, 0.5)
    assert loss.dtype == torch.float32
    assert metrics["loss"] == pytest.approx(expected, abs=1e-5)
    assert metrics["rate_reduction"] == pytest.approx(-expected, abs=1e-5)


def test_unnormalised_rows_are_normalised_first():
    z = _normalised(20, 6, seed=3)
    scales = np.random.default_rng(4).uniform(0.1, 10.0, size=(20, 1))
    assert coding_rate(torch.from_numpy(z * scales), 0.5).item() == pytest.approx(
        reference_rate(z, 0.5), rel=1e-10
    )


def test_full_loss_with_pairs_matches_reference():
    z = _normalised(30, 5, seed=5)
    ids = np.arange(30) // 6
    a, b = _normalised(12, 5, seed=6), _normalised(12, 5, seed=7)
    lam = 0.7
    loss_fn = MCR2Loss(MCR2LossConfig(eps=0.6, pair_weight=lam))
    t = torch.from_numpy
    loss, metrics = loss_fn(t(z), t(ids), views=(t(a), t(b)))
    mean_cos = float(np.mean(np.sum(a * b, axis=1)))
    expected = -reference_rate(z, 0.6) + reference_compressed_rate(z, ids, 0.6) - lam * mean_cos
    assert loss.item() == pytest.approx(expected, rel=1e-10)
    assert metrics["pair_cosine"] == pytest.approx(mean_cos, rel=1e-10)


def test_grouping_equals_dense_membership_formulation():
    z = torch.from_numpy(_normalised(24, 6, seed=8))
    ids = torch.tensor([5, 1, 1, 9, 5, 5, 9, 1, 2, 2, 2, 2, 9, 9, 5, 1, 1, 2, 9, 5, 5, 1, 2, 9])
    one_hot = torch.nn.functional.one_hot(torch.unique(ids, return_inverse=True)[1]).double()
    dense = dense_membership_rate(z, one_hot, eps=0.5)
    assert compressed_coding_rate(z, ids, 0.5).item() == pytest.approx(dense.item(), rel=1e-10)


def test_soft_assignments_match_dense_membership_formulation():
    z = torch.from_numpy(_normalised(20, 4, seed=9))
    pi = torch.softmax(torch.from_numpy(np.random.default_rng(10).standard_normal((20, 3))), 1)
    dense = dense_membership_rate(z, pi, eps=0.5)
    got = soft_compressed_coding_rate(z, pi, 0.5)
    assert got.item() == pytest.approx(dense.item(), rel=1e-8)


def test_hard_assignments_equal_one_hot_soft_assignments():
    z = torch.from_numpy(_normalised(50, 7, seed=11))
    ids = torch.from_numpy(np.random.default_rng(12).integers(0, 6, size=50))
    one_hot = torch.nn.functional.one_hot(ids, num_classes=8).double()  # 2 empty clusters
    hard = compressed_coding_rate(z, ids, 0.5)
    soft = soft_compressed_coding_rate(z, one_hot, 0.5)
    assert hard.item() == pytest.approx(soft.item(), rel=1e-7)


def test_rate_reduction_is_non_negative():
    # R(Z) ≥ R_c(Z, Π) for any partition (concavity of logdet, Yu et al. 2020, lemma A.4).
    for seed in range(5):
        z = torch.from_numpy(_normalised(32, 8, seed=seed))
        ids = torch.from_numpy(np.random.default_rng(seed).integers(0, 4, size=32))
        assert coding_rate(z, 0.5) >= compressed_coding_rate(z, ids, 0.5) - 1e-12


@pytest.mark.parametrize("soft", [False, True])
def test_gradient_matches_finite_differences(soft):
    torch.manual_seed(0)
    z = torch.randn(10, 4, dtype=torch.float64, requires_grad=True)
    views = (
        torch.randn(5, 4, dtype=torch.float64, requires_grad=True),
        torch.randn(5, 4, dtype=torch.float64, requires_grad=True),
    )
    if soft:
        clusters = torch.softmax(torch.randn(10, 3, dtype=torch.float64), 1).requires_grad_()
    else:
        clusters = torch.tensor([0, 0, 1, 1, 1, 4, 4, 0, 1, 4])
    loss_fn = MCR2Loss(MCR2LossConfig(eps=0.5, pair_weight=0.3))

    def f(z, *rest):
        c = rest[2] if soft else clusters
        return loss_fn(z, c, views=(rest[0], rest[1]))[0]

    inputs = (z, *views, clusters) if soft else (z, *views)
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-6)


def test_bad_inputs_name_the_problem():
    z = torch.randn(6, 3)
    loss_fn = MCR2Loss()
    with pytest.raises(ValueError, match="cluster ids of shape"):
        loss_fn(z, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="soft assignments of shape"):
        loss_fn(z, torch.rand(5, 2))
    with pytest.raises(ValueError, match="pair views differ"):
        loss_fn(z, torch.zeros(6, dtype=torch.long), views=(torch.randn(2, 3), torch.randn(3, 3)))
    with pytest.raises(FloatingPointError, match="NaN or inf"):
        loss_fn(torch.full((6, 3), float("nan")), torch.zeros(6, dtype=torch.long))
    with pytest.raises(ValueError, match="eps must be > 0"):
        MCR2Loss(MCR2LossConfig(eps=0.0))
    with pytest.raises(ValueError, match="compute_dtype"):
        MCR2Loss(MCR2LossConfig(compute_dtype="float16"))


def test_many_clusters_never_build_a_dense_membership_tensor():
    # 20,000 rows in 5,000 clusters: a k×n×n membership tensor would be 2·10¹² entries
    # (16 TB in float64); grouping by index needs k Grams of d×d.
    n, k, d = 20_000, 5_000, 4
    generator = torch.Generator().manual_seed(0)
    z = torch.nn.functional.normalize(torch.randn(n, d, generator=generator, dtype=torch.float64))
    ids = torch.randint(0, k, (n,), generator=generator)
    got = compressed_coding_rate(z, ids, 0.5).item()
    # Equal to the plain per-cluster reference on the full set.
    assert got == pytest.approx(reference_compressed_rate(z.numpy(), ids.numpy(), 0.5), rel=1e-9)


def test_distill_weight_adds_the_similarity_kl_and_needs_the_teacher():
    torch.manual_seed(3)
    z, teacher = torch.randn(12, 4), torch.randn(12, 10)
    ids = torch.arange(12) % 3
    plain, _ = MCR2Loss(MCR2LossConfig(distill_weight=0.0))(z, ids)
    weighted, metrics = MCR2Loss(MCR2LossConfig(distill_weight=0.7, distill_temperature=0.1))(
        z, ids, teacher=teacher
    )
    kl = float(similarity_distillation_loss(z, teacher, 0.1))
    assert metrics["similarity_kl"] == pytest.approx(kl)
    assert float(weighted) == pytest.approx(float(plain) + 0.7 * kl, rel=1e-5)
    with pytest.raises(ValueError, match="needs the teacher"):
        MCR2Loss(MCR2LossConfig(distill_weight=0.7))(z, ids)
    with pytest.raises(ValueError, match="distill_temperature must be > 0"):
        MCR2Loss(MCR2LossConfig(distill_temperature=0.0))
