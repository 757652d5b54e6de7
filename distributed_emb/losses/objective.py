"""L = α·L_C + λ·L_R + β·L_MLM + δ·L_D + γ·L_MCR²: combines the terms with their weights;
returns (loss, metrics). α = 1 and δ = γ = 0 by default (InforMin-CL); α = 0, δ > 0 is plain
distillation from a teacher (losses/distillation.py); α = 0, γ > 0 fine-tunes an encoder and
its compression head with the MCR² objective (losses/mcr2.py). The weights are the `loss`
settings of the training config (LossConfig, declared in losses/loss_config.py)."""

from __future__ import annotations

import torch

from distributed_emb.losses.distillation import distillation_loss
from distributed_emb.losses.info_nce import info_nce_loss
from distributed_emb.losses.loss_config import LossConfig, MCR2LossConfig
from distributed_emb.losses.mcr2 import MCR2Loss
from distributed_emb.losses.reconstruction import reconstruction_loss


def embedding_objective(
    z1: torch.Tensor,
    z2: torch.Tensor,
    weights: LossConfig,
    groups: torch.Tensor | None = None,
    teacher_vectors: torch.Tensor | None = None,
    sizes: list[int] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The embedding terms α·L_C + λ·L_R + δ·L_D + γ·L_MCR² on (B, d) views (`teacher_vectors`:
    the teacher's (2B, D) vectors of the rows behind z1 then z2, needed by δ and by MCR²'s μ;
    `groups` (B,): the rows' documents, negatives to no one in L_C, MCR²'s clusters Π;
    `sizes`: every rank's B, where the step already gathered them, for L_C's gathers);
    metrics stay tensors (no host sync) except MCR²'s."""
    loss = z1.new_zeros(())
    metrics = {}
    if weights.contrastive_weight > 0:  # α = 0: no gather, no similarity matrix
        contrastive = info_nce_loss(
            z1, z2, weights.temperature, weights.gather_negatives, groups, sizes
        )
        loss = loss + weights.contrastive_weight * contrastive
        metrics["loss_contrastive"] = contrastive.detach()
    if weights.reconstruction_weight > 0:
        reconstruction = reconstruction_loss(z1, z2, weights.reconstruction_form)
        loss = loss + weights.reconstruction_weight * reconstruction
        metrics["loss_reconstruction"] = reconstruction.detach()
    if weights.distill_weight > 0:
        if teacher_vectors is None:
            raise ValueError("loss.distill_weight > 0 but the batch has no teacher vectors")
        distill = distillation_loss(z1, z2, teacher_vectors)
        loss = loss + weights.distill_weight * distill
        metrics["loss_distill"] = distill.detach()
    if weights.mcr2_weight > 0:
        mcr2, mcr2_metrics = mcr2_term(z1, z2, weights.mcr2, groups, teacher_vectors)
        loss = loss + weights.mcr2_weight * mcr2
        metrics.update({f"mcr2_{k}": z1.new_tensor(v) for k, v in mcr2_metrics.items()})
    return loss, metrics


def mcr2_term(
    z1: torch.Tensor,
    z2: torch.Tensor,
    config: MCR2LossConfig,
    groups: torch.Tensor | None,
    teacher_vectors: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The MCR² loss of the compression job's heads on this worker's first view z1 (B, d):
    clusters = the rows' groups, the pair term between the two dropout views, the teacher's
    rows of z1 for the neighbourhood term. Per worker, like the frozen-encoder heads' batches:
    logdets of a gathered batch would need every worker's rows with gradients; DDP averages
    the workers' gradients, i.e. of the mean of their losses."""
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


def add_mlm_term(
    loss: torch.Tensor, metrics: dict, mlm: torch.Tensor | None, weights: LossConfig
) -> torch.Tensor:
    if mlm is None or weights.mlm_weight == 0:
        return loss
    metrics["loss_mlm"] = mlm.detach()
    return loss + weights.mlm_weight * mlm
