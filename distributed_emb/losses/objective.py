"""L = L_C + λ·L_R + β·L_MLM: combines the terms with their weights; returns (loss, metrics)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from distributed_emb.losses.info_nce import info_nce_loss
from distributed_emb.losses.reconstruction import reconstruction_loss


@dataclass
class ObjectiveWeights:
    temperature: float = 0.05
    reconstruction_weight: float = 0.0
    reconstruction_form: str = "normalized_mse"
    mlm_weight: float = 0.0
    gather_negatives: bool = True

    @classmethod
    def from_config(cls, loss_config) -> ObjectiveWeights:
        return cls(
            temperature=loss_config.temperature,
            reconstruction_weight=loss_config.reconstruction_weight,
            reconstruction_form=loss_config.reconstruction_form,
            mlm_weight=loss_config.mlm_weight,
            gather_negatives=loss_config.gather_negatives,
        )


def embedding_objective(
    z1: torch.Tensor,
    z2: torch.Tensor,
    weights: ObjectiveWeights,
    groups: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The embedding terms L_C + λ·L_R on (B, d) views; metrics stay tensors (no host sync)."""
    contrastive = info_nce_loss(z1, z2, weights.temperature, weights.gather_negatives, groups)
    loss = contrastive
    metrics = {"loss_contrastive": contrastive.detach()}
    if weights.reconstruction_weight > 0:
        reconstruction = reconstruction_loss(z1, z2, weights.reconstruction_form)
        loss = loss + weights.reconstruction_weight * reconstruction
        metrics["loss_reconstruction"] = reconstruction.detach()
    return loss, metrics


def add_mlm_term(
    loss: torch.Tensor, metrics: dict, mlm: torch.Tensor | None, weights: ObjectiveWeights
) -> torch.Tensor:
    if mlm is None or weights.mlm_weight == 0:
        return loss
    metrics["loss_mlm"] = mlm.detach()
    return loss + weights.mlm_weight * mlm
