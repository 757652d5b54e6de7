"""One training step's math: forward both views, the objective, backward.

Kept apart from the loop so the cached-gradient step (GradCache) can replace it, and so tests
can call exactly what the workers run.
"""

from __future__ import annotations

import contextlib

import torch

from distributed_emb.losses.mlm import mlm_loss
from distributed_emb.losses.objective import LossConfig, add_mlm_term, embedding_objective


def forward_objective(
    forward_module, batch: dict[str, torch.Tensor], weights: LossConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss and metrics for one batch (rows [0, B) first view, [B, 2B) second view)."""
    use_mlm = weights.mlm_weight > 0 and "mlm_input_ids" in batch
    outputs = forward_module(
        batch["input_ids"],
        batch["attention_mask"],
        mlm_input_ids=batch["mlm_input_ids"] if use_mlm else None,
        mlm_attention_mask=batch["mlm_attention_mask"] if use_mlm else None,
    )
    z, logits = outputs if use_mlm else (outputs, None)
    z1, z2 = _full_precision(z).chunk(2)  # (B, d) each
    loss, metrics = embedding_objective(
        z1, z2, weights, batch.get("groups"), batch.get("teacher_vectors")
    )
    mlm = mlm_loss(_full_precision(logits), batch["mlm_labels"]) if use_mlm else None
    loss = add_mlm_term(loss, metrics, mlm, weights)
    metrics["loss"] = loss.detach()
    return loss, metrics


def plain_step(engine, batch: dict[str, torch.Tensor], weights: LossConfig, sync: bool):
    """Forward + backward of one (micro-)batch; `sync=False` skips DDP's all-reduce
    (gradient accumulation: only the last micro-batch of a step synchronises)."""
    context = engine.no_sync() if not sync else contextlib.nullcontext()
    with context:
        with engine.autocast():
            loss, metrics = forward_objective(engine.forward_module, batch, weights)
        engine.backward(loss)
    return metrics


def _full_precision(tensor: torch.Tensor) -> torch.Tensor:
    """Losses in at least fp32: softmax over thousands of negatives at τ = 0.05 loses too
    much in bf16/fp16; fp64 (tests) stays fp64."""
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor
