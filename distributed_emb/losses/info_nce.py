"""InfoNCE over the global batch (SimCSE / InforMin-CL's L_C), optionally with hard negatives.

Inputs on each rank: z1, z2 of shape (B, d): two views of the same B sentences (or the anchor
and positive of B pairs). Candidates for row i are all G = Σ_r B_r second views gathered from
every worker (with gradients; the workers' B_r may differ by one, data/epoch_plan.py
split_rows); the positive of local row i sits at column o + i, o = B_0 + … + B_{rank−1}.

    s_ij = cos(z1_i, z2_j) / τ,   L_C = mean_i CE(s_i, o + i)

With `negatives` (B, d), each row's hard negative (data.negative_column), the G gathered
negatives are candidates of every row too, after the G second views: logits (B, 2G), the
positive still at column o + i (SimCSE's supervised objective with hard negatives, eq. 5,
without its negative weighting):

    s_i = [cos(z1_i, z2_j) / τ for j < G] ++ [cos(z1_i, n_j) / τ for j < G]

Optional `groups` (B,) of ints marks rows that must not be each other's negatives (pairs mined
from the same document): their off-positive logits are masked to −inf. A hard negative's own
group is not known (mining already leaves out the anchor's own document), so the negatives'
columns are never masked.

Reference: Gao et al., SimCSE (2021), eq. 1 and 5; Chen et al., InforMin-CL (2022).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from distributed_emb import distributed


def info_nce_loss(
    z1: torch.Tensor,
    z2: torch.Tensor,
    temperature: float,
    gather: bool = True,
    groups: torch.Tensor | None = None,
    sizes: list[int] | None = None,
    negatives: torch.Tensor | None = None,
) -> torch.Tensor:
    """`sizes`: every rank's B (distributed.gather_sizes), where the caller has them already;
    else gathered here, once for both gathers. `negatives` (B, d): the rows' hard negatives,
    gathered with z2 in one collective."""
    batch = z1.shape[0]
    candidates = z2 if negatives is None else torch.cat([z2, negatives], dim=-1)  # (B, d | 2d)
    if gather:
        sizes = distributed.gather_sizes(batch) if sizes is None else sizes
        candidates = distributed.gather_with_grad(candidates, sizes)  # (G, d | 2d)
        offset = distributed.row_offset(sizes)
    else:
        sizes, offset = None, 0
    if negatives is not None:  # (G, 2d) → (2G, d): the second views, then the negatives
        candidates = torch.cat(candidates.split(z2.shape[-1], dim=-1))
    logits = F.normalize(z1, dim=-1) @ F.normalize(candidates, dim=-1).T / temperature  # (B, G|2G)
    labels = torch.arange(batch, device=z1.device) + offset  # (B,)
    if groups is not None:
        all_groups = distributed.gather_no_grad(groups, sizes) if gather else groups  # (G,)
        same_group = groups[:, None] == all_groups[None, :]  # (B, G)
        same_group[torch.arange(batch, device=z1.device), labels] = False
        if negatives is not None:  # the negatives' columns, past the G views: never masked
            same_group = torch.cat([same_group, torch.zeros_like(same_group)], dim=1)  # (B, 2G)
        logits = logits.masked_fill(same_group, float("-inf"))
    return F.cross_entropy(logits, labels)
