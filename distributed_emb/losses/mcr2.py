"""Maximal coding rate reduction (MCR²) with an optional pair-similarity term.

For Z (n×d, rows L2-normalised) and cluster assignments Π::

    R(Z)      = ½ · logdet(I_d + d/(n·ε²) · ZᵀZ)
    R_c(Z, Π) = Σₖ nₖ/(2n) · logdet(I_d + d/(nₖ·ε²) · ZₖᵀZₖ)          (hard Π, Zₖ = rows of k)
              = Σₖ tr(Πₖ)/(2n) · logdet(I_d + d/(tr(Πₖ)·ε²) · Zᵀ diag(Πₖ) Z)   (soft Π, n×k)
    loss      = −R(Z) + R_c(Z, Π) − λ · mean_i cos(ẑ¹ᵢ, ẑ²ᵢ)

Maximising R spreads the whole batch over many directions; minimising R_c packs each cluster
into a low-dimensional subspace; the last term keeps known paraphrases (or two views of one
sentence) together. References: Yu et al., "Learning Diverse and Discriminative
Representations via the Principle of Maximal Coding Rate Reduction", NeurIPS 2020
(https://arxiv.org/abs/2006.08558); Ševerdija et al., "Compressing Sentence Representation
with Maximum Coding Rate Reduction", 2023.

ε here is the distortion ε of the paper's formula, so the rate uses ε². The authors' code
(`ma-lab-berkeley/mcr2`) takes its ``eps`` argument as ε² directly: their ``eps=0.5`` is our
``eps=sqrt(0.5)``.

Every logdet is taken on a d×d matrix (d = embedding size, small for a compression head) by
Cholesky, which cannot fail on I + c·ZᵀZ (eigenvalues ≥ 1) unless Z holds NaN/inf. Hard
clusters are grouped by sorting their ids and splitting the sorted rows; no k×n×n membership
tensor is ever built.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from distributed_emb.losses.distillation import similarity_distillation_loss
from distributed_emb.losses.loss_config import MCR2LossConfig

# Added to a soft cluster's mass tr(Πₖ), as the MCR² reference code does, so an empty soft
# cluster contributes 0·logdet(I) instead of 0/0.
_SOFT_MASS_FLOOR = 1e-8


def _logdet_spd(matrix: torch.Tensor) -> torch.Tensor:
    """logdet of symmetric positive definite matrices (..., d, d) through their Cholesky factor."""
    factor, info = torch.linalg.cholesky_ex(matrix)
    if bool((info != 0).any()):
        raise FloatingPointError(
            "MCR²: I + c·ZᵀZ is not positive definite; the embeddings contain NaN or inf"
        )
    return 2.0 * torch.log(torch.diagonal(factor, dim1=-2, dim2=-1)).sum(-1)


def _prepare(z: torch.Tensor, compute_dtype: torch.dtype | None) -> torch.Tensor:
    if z.dim() != 2:
        raise ValueError(f"MCR²: embeddings must be (n, d), got shape {tuple(z.shape)}")
    if compute_dtype is not None:
        z = z.to(compute_dtype)
    return F.normalize(z, dim=1)


def coding_rate(z: torch.Tensor, eps: float, compute_dtype: torch.dtype | None = None):
    """R(Z) = ½·logdet(I + d/(n·ε²)·ZᵀZ), rows of `z` (n, d) normalised first."""
    z = _prepare(z, compute_dtype)
    n, d = z.shape
    gram = z.T @ z  # (d, d)
    eye = torch.eye(d, dtype=z.dtype, device=z.device)
    return 0.5 * _logdet_spd(eye + (d / (n * eps**2)) * gram)


def group_by_cluster(cluster_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row order that puts each cluster's rows together, and each cluster's size.

    `cluster_ids` (n,) may be any integers (document ids, labels); clusters are numbered by
    sorted id. Returns ``order`` (n,) and ``counts`` (k,).
    """
    if cluster_ids.dim() != 1 or cluster_ids.dtype.is_floating_point:
        raise ValueError(
            f"MCR²: hard cluster ids must be a 1-D integer tensor, got {cluster_ids.dtype} "
            f"of shape {tuple(cluster_ids.shape)}"
        )
    _, inverse, counts = torch.unique(cluster_ids, return_inverse=True, return_counts=True)
    order = torch.argsort(inverse, stable=True)  # rows of cluster 0, then cluster 1, ...
    return order, counts


def cluster_grams(z: torch.Tensor, cluster_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-cluster Grams ZₖᵀZₖ (k, d, d) and sizes nₖ (k,) for hard ids (n,)."""
    order, counts = group_by_cluster(cluster_ids.to(z.device))
    blocks = torch.split(z.index_select(0, order), counts.tolist())  # k × (nₖ, d)
    grams = torch.stack([block.T @ block for block in blocks])  # (k, d, d)
    return grams, counts.to(z.dtype)


def compressed_coding_rate(
    z: torch.Tensor,
    cluster_ids: torch.Tensor,
    eps: float,
    compute_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """R_c(Z, Π) for hard assignments: Σₖ nₖ/(2n)·logdet(I + d/(nₖ·ε²)·ZₖᵀZₖ)."""
    z = _prepare(z, compute_dtype)
    n, d = z.shape
    if cluster_ids.shape != (n,):
        raise ValueError(
            f"MCR²: {n} embeddings but cluster ids of shape {tuple(cluster_ids.shape)}"
        )
    grams, sizes = cluster_grams(z, cluster_ids)  # (k, d, d), (k,)
    eye = torch.eye(d, dtype=z.dtype, device=z.device)
    scale = (d / (sizes * eps**2))[:, None, None]  # (k, 1, 1)
    logdets = _logdet_spd(eye + scale * grams)  # (k,)
    return (sizes / (2 * n) * logdets).sum()


def soft_compressed_coding_rate(
    z: torch.Tensor,
    membership: torch.Tensor,
    eps: float,
    compute_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """R_c(Z, Π) for soft assignments Π (n, k), rows summing to 1 (MCR² paper, eq. 8).

    Σₖ tr(Πₖ)/(2n)·logdet(I + d/(tr(Πₖ)·ε²)·Zᵀ diag(Πₖ) Z), where tr(Πₖ) = Σᵢ Πᵢₖ is the
    cluster's mass. Memory is k·n·d for the weighted rows, never k·n·n.
    """
    z = _prepare(z, compute_dtype)
    n, d = z.shape
    if membership.dim() != 2 or membership.shape[0] != n:
        raise ValueError(
            f"MCR²: {n} embeddings but soft assignments of shape {tuple(membership.shape)}"
        )
    membership = membership.to(z.dtype)
    mass = membership.sum(0) + _SOFT_MASS_FLOOR  # (k,)
    weighted = membership.T[:, :, None] * z[None, :, :]  # (k, n, d): Πᵢₖ·zᵢ
    grams = weighted.transpose(1, 2) @ z  # (k, d, d): Zᵀ diag(Πₖ) Z
    eye = torch.eye(d, dtype=z.dtype, device=z.device)
    scale = (d / (mass * eps**2))[:, None, None]
    logdets = _logdet_spd(eye + scale * grams)  # (k,)
    return (mass / (2 * n) * logdets).sum()


def pair_cosine(view1: torch.Tensor, view2: torch.Tensor) -> torch.Tensor:
    """mean_i cos(ẑ¹ᵢ, ẑ²ᵢ) for two (m, d) batches whose rows correspond."""
    if view1.shape != view2.shape:
        raise ValueError(
            f"MCR²: pair views differ in shape: {tuple(view1.shape)} vs {tuple(view2.shape)}"
        )
    return F.cosine_similarity(view1, view2, dim=1).mean()


class MCR2Loss(torch.nn.Module):
    """loss = −w_e·R(Z) + w_c·R_c(Z, Π) − λ·mean cos(ẑ¹ᵢ, ẑ²ᵢ) + μ·KL(P_teacher ‖ P_z).

    forward(z, clusters, views=None, teacher=None):
      z: (n, d) embeddings (normalised here);
      clusters: (n,) integer cluster ids (hard) or (n, k) float probabilities (soft);
      views: optional pair (ẑ¹, ẑ²) of (m, d) batches whose rows are similar;
      teacher: optional (n, D) vectors of z's rows whose in-batch similarities z should keep
        (the frozen encoder's); needed when distill_weight > 0.
    Returns (loss, metrics) where metrics hold detached floats.
    """

    def __init__(self, config: MCR2LossConfig | None = None) -> None:
        super().__init__()
        self.config = config or MCR2LossConfig()
        if self.config.eps <= 0:
            raise ValueError(f"MCR² eps must be > 0, got {self.config.eps}")
        if self.config.distill_temperature <= 0:
            raise ValueError(
                f"MCR² distill_temperature must be > 0, got {self.config.distill_temperature}"
            )
        dtypes = {None: None, "float32": torch.float32, "float64": torch.float64}
        if self.config.compute_dtype not in dtypes:
            raise ValueError(
                f"MCR² compute_dtype must be one of {sorted(k for k in dtypes if k)} or null, "
                f"got {self.config.compute_dtype!r}"
            )
        self._dtype = dtypes[self.config.compute_dtype]

    def forward(
        self,
        z: torch.Tensor,
        clusters: torch.Tensor,
        views: tuple[torch.Tensor, torch.Tensor] | None = None,
        teacher: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.config
        rate = coding_rate(z, cfg.eps, self._dtype)
        if clusters.dtype.is_floating_point:
            rate_c = soft_compressed_coding_rate(z, clusters, cfg.eps, self._dtype)
        else:
            rate_c = compressed_coding_rate(z, clusters, cfg.eps, self._dtype)
        loss = (-cfg.expand_weight * rate + cfg.compress_weight * rate_c).to(z.dtype)
        metrics = {
            "rate": rate.item(),
            "rate_compressed": rate_c.item(),
            "rate_reduction": (rate - rate_c).item(),
        }
        if views is not None and cfg.pair_weight != 0:
            cos = pair_cosine(*views)
            loss = loss - cfg.pair_weight * cos
            metrics["pair_cosine"] = cos.item()
        if cfg.distill_weight != 0:
            if teacher is None:
                raise ValueError("MCR²: distill_weight > 0 needs the teacher's vectors of z's rows")
            kl = similarity_distillation_loss(z, teacher, cfg.distill_temperature)
            loss = loss + cfg.distill_weight * kl
            metrics["similarity_kl"] = kl.item()
        metrics["loss"] = loss.item()
        return loss, metrics


def mcr2_term(
    z1: torch.Tensor,
    z2: torch.Tensor,
    config: MCR2LossConfig,
    groups: torch.Tensor | None,
    teacher_vectors: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The training step's MCR² term (γ·L_MCR², losses/terms.py): the loss of the compression
    job's heads on this worker's first view z1 (B, d): clusters = the rows' groups (B,), the
    pair term between the two dropout views, the teacher's (2B, D) rows of z1 for the
    neighbourhood term. Per worker, like the frozen-encoder heads' batches: logdets of a
    gathered batch would need every worker's rows with gradients; DDP averages the workers'
    gradients, i.e. of the mean of their losses."""
    if groups is None:
        if config.compress_weight > 0:
            raise ValueError("the MCR² term needs each row's group (data.group_column)")
        groups = torch.zeros(len(z1), dtype=torch.long, device=z1.device)
    teacher = None
    if config.distill_weight > 0:
        if teacher_vectors is None:
            raise ValueError("loss.mcr2.distill_weight > 0 but the batch has no teacher vectors")
        teacher = teacher_vectors[: len(z1)].to(z1.dtype)  # the rows behind z1
    return MCR2Loss(config)(z1, groups, (z1, z2), teacher=teacher)
