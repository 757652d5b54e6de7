"""Masked-language-modelling auxiliary loss (SimCSE's optional β·L_MLM).

Input: MLM logits (B, L, V) and labels (B, L) with −100 at unmasked positions. The mean is over
this rank's masked tokens; the step weights each rank's loss by its share of the global batch
(train/step.py rank_weight), so ranks count by rows, not by masked tokens (the difference from
a global token mean is negligible at 15% masking).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    if not bool((labels != -100).any()):
        # No masked token in this batch (tiny batches): a zero that keeps the graph connected.
        return logits.sum() * 0.0
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100
    )
