"""Distillation term L_D: pull the student's sentence vectors onto a frozen teacher's.

The plain peer a user reaches for when shrinking an encoder (sentence-transformers' MSELoss):
the element-mean squared error between each row's vector and the teacher's vector of the same
text,

    L_D = ½ · (MSE(z¹, t¹) + MSE(z², t²)),

where t¹, t² are the teacher's vectors of the rows behind z¹ and z² (for a sentence corpus the
same sentence twice, so t¹ = t²; for pairs, the anchor's and the positive's). Pooled vectors
before any normalisation: what the exported model normalises, if it does, it normalises in
both. The teacher runs without dropout (train/teacher.py), so t is a target, not a third view.
Local to each row: no gather.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def distillation_loss(z1: torch.Tensor, z2: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """z1, z2: (B, d) the two views; targets: (2B, d) the teacher's vectors of the rows behind
    z1 then z2 (no gradient reaches them)."""
    z = torch.cat([z1, z2])
    if targets.shape != z.shape:
        raise ValueError(
            f"teacher vectors {tuple(targets.shape)} do not match the student's "
            f"{tuple(z.shape)}: the teacher and the student must have the same dimension"
        )
    # Equal halves: the mean over 2B rows is the mean of the two views' MSEs.
    return F.mse_loss(z, targets.detach().to(z.dtype))
