"""The optimizer and learning-rate schedule every engine trains with (DDP and DeepSpeed alike,
so one config trains the same way under either)."""

from __future__ import annotations

import torch
from torch import nn

from distributed_emb.train.train_config import TrainLoopConfig


def build_optimizer(
    module: nn.Module, train: TrainLoopConfig, fused: bool = False
) -> torch.optim.AdamW:
    """AdamW with the `train` settings; `fused=True` updates all parameters in one kernel (on
    CPU about 3× faster than the default per-parameter loop for MiniLM: docs/BENCHMARKS.md, 7c),
    same math."""
    # No decay on biases and LayerNorm weights (BERT/SimCSE convention).
    decay, no_decay = [], []
    for name, parameter in module.named_parameters():
        if not parameter.requires_grad:
            continue
        (no_decay if parameter.ndim < 2 or "LayerNorm" in name else decay).append(parameter)
    groups = [
        {"params": decay, "weight_decay": train.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=train.learning_rate, fused=fused or None)


def build_scheduler(optimizer, total_steps: int, train: TrainLoopConfig):
    """Linear warm-up (train.warmup_ratio of the steps) then linear decay over `total_steps`
    optimizer steps, to train.min_learning_rate_ratio × the peak.

    Not transformers' `get_linear_schedule_with_warmup`: that one starts the warm-up at a
    learning rate of 0 (step / warmup), this one at 1 / warmup ((step + 1) / warmup), so the
    first optimizer step already learns; after the warm-up the two are the same.
    """
    warmup = int(total_steps * train.warmup_ratio)

    floor = train.min_learning_rate_ratio

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        decay = max(0.0, (total_steps - step) / max(1, total_steps - warmup))
        return floor + (1.0 - floor) * decay

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
