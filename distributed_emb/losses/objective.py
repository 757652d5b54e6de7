"""L = α·L_C + λ·L_R + β·L_MLM + δ·L_D: combines the terms with their weights; returns
(loss, metrics). α = 1 and δ = 0 by default (InforMin-CL); α = 0, δ > 0 is plain distillation
from a teacher (losses/distillation.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from distributed_emb.losses.distillation import distillation_loss
from distributed_emb.losses.info_nce import info_nce_loss
from distributed_emb.losses.reconstruction import reconstruction_loss


@dataclass
class ObjectiveWeights:
    temperature: float = 0.05
    reconstruction_weight: float = 0.0
    reconstruction_form: str = "normalized_mse"
    mlm_weight: float = 0.0
    gather_negatives: bool = True
    contrastive_weight: float = 1.0
    distill_weight: float = 0.0

    @classmethod
    def from_config(cls, loss_config) -> ObjectiveWeights:
        return cls(
            temperature=loss_config.temperature,
            reconstruction_weight=loss_config.reconstruction_weight,
            reconstruction_form=loss_config.reconstruction_form,
            mlm_weight=loss_config.mlm_weight,
            gather_negatives=loss_config.gather_negatives,
            contrastive_weight=loss_config.contrastive_weight,
            distill_weight=loss_config.distill_weight,
        )


def embedding_objective(
    z1: torch.Tensor,
    z2: torch.Tensor,
    weights: ObjectiveWeights,
    groups: torch.Tensor | None = None,
    teacher_vectors: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The embedding terms α·L_C + λ·L_R + δ·L_D on (B, d) views (`teacher_vectors`: the
    teacher's (2B, d) vectors of the rows behind z1 then z2, needed when δ > 0); metrics stay
    tensors (no host sync)."""
    loss = z1.new_zeros(())
    metrics = {}
    if weights.contrastive_weight > 0:  # α = 0: no gather, no similarity matrix
        contrastive = info_nce_loss(z1, z2, weights.temperature, weights.gather_negatives, groups)
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
    return loss, metrics


def add_mlm_term(
    loss: torch.Tensor, metrics: dict, mlm: torch.Tensor | None, weights: ObjectiveWeights
) -> torch.Tensor:
    if mlm is None or weights.mlm_weight == 0:
        return loss
    metrics["loss_mlm"] = mlm.detach()
    return loss + weights.mlm_weight * mlm
