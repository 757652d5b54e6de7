"""InforMin-CL's reconstruction term L_R: pull the two views of each sentence together.

Two forms, because the paper and the released code differ (see docs/LOSSES.md):
- "squared_norm" (paper, eq. 8): L_R = mean_i ‖z1_i − z2_i‖² on the raw vectors.
- "normalized_mse" (as the design notes describe the authors' released code): L2-normalise
  both views, then the element-mean squared error in both directions, summed:
  MSE(ẑ1, ẑ2) + MSE(ẑ2, ẑ1) = 2 · mean_i ‖ẑ1_i − ẑ2_i‖² / d. Bounded (≤ 8/d), so λ values
  tuned in this form are much larger than in the raw form.

Input: z1, z2 (B, d) local rows; the term is local to each sentence, so no gather is needed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def reconstruction_loss(z1: torch.Tensor, z2: torch.Tensor, form: str) -> torch.Tensor:
    if form == "squared_norm":
        return (z1 - z2).pow(2).sum(dim=-1).mean()
    if form == "normalized_mse":
        n1, n2 = F.normalize(z1, dim=-1), F.normalize(z2, dim=-1)
        return F.mse_loss(n1, n2) + F.mse_loss(n2, n1)
    raise ValueError(f"unknown reconstruction form {form!r}")
