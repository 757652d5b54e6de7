"""One training step's math: forward both views, the objective, backward.

Kept apart from the loop so the cached-gradient step (GradCache) can replace it, and so tests
can call exactly what the workers run. Both steps weight each rank's loss with `rank_weight`
and report `global_means`, so unequal slices of the global batch train and log as one batch.
"""

from __future__ import annotations

import contextlib

import torch

from distributed_emb import distributed
from distributed_emb.losses.mlm import mlm_loss
from distributed_emb.losses.objective import LossConfig, add_mlm_term, embedding_objective


def forward_objective(
    forward_module, batch: dict[str, torch.Tensor], weights: LossConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(loss to backpropagate, metrics) for one batch (rows [0, B) first view, [B, 2B) second
    view): the loss is this rank's, weighted by rank_weight; the metrics are global means."""
    use_mlm = weights.mlm_weight > 0 and "mlm_input_ids" in batch
    outputs = forward_module(
        batch["input_ids"],
        batch["attention_mask"],
        mlm_input_ids=batch["mlm_input_ids"] if use_mlm else None,
        mlm_attention_mask=batch["mlm_attention_mask"] if use_mlm else None,
    )
    z, logits = outputs if use_mlm else (outputs, None)
    z1, z2 = _full_precision(z).chunk(2)  # (B, d) each
    sizes = distributed.gather_sizes(z1.shape[0])  # for the weight and L_C's gathers
    loss, metrics = embedding_objective(
        z1, z2, weights, batch.get("groups"), batch.get("teacher_vectors"), sizes
    )
    weight = rank_weight(sizes)
    mlm = mlm_loss(_full_precision(logits), batch["mlm_labels"]) if use_mlm else None
    loss = add_mlm_term(loss, metrics, mlm, weights)
    metrics["loss"] = loss.detach()
    return loss * weight, global_means(metrics, weight)


def plain_step(engine, batch: dict[str, torch.Tensor], weights: LossConfig, sync: bool):
    """Forward + backward of one (micro-)batch; `sync=False` skips DDP's all-reduce
    (gradient accumulation: only the last micro-batch of a step synchronises)."""
    context = engine.no_sync() if not sync else contextlib.nullcontext()
    with context:
        with engine.autocast():
            loss, metrics = forward_objective(engine.forward_module, batch, weights)
        engine.backward(loss)
    return metrics


def rank_weight(sizes: list[int]) -> float:
    """W·B_r/G: the factor on this rank's loss, where rank r holds B_r = sizes[r] rows of the
    global batch's G = Σ_r B_r (distributed.gather_sizes); exactly 1 when the slices are equal.

    Each rank's loss is a mean over its own B_r rows, and DDP (DeepSpeed too) averages the
    ranks' parameter gradients: (1/W)·Σ_r ∇(W·B_r/G · L_r) = Σ_r (B_r/G)·∇L_r, the gradient of
    the mean over all G rows, also when W does not divide G and the B_r differ by one.

    MLM's term is a mean over a rank's masked tokens, not its rows: weighted by rows, the
    gradient is that of Σ_r (B_r/G)·L_MLM_r, the global per-token mean only where every rank
    masks tokens in proportion to its rows (approximately, at the masking rate over many rows).
    MCR²'s per-worker term becomes the row-weighted mean of the workers' terms.
    """
    return len(sizes) * sizes[distributed.rank()] / sum(sizes)


def global_means(metrics: dict[str, torch.Tensor], weight: float) -> dict[str, torch.Tensor]:
    """Each metric (a mean over this rank's rows) as the mean over the global batch: the ranks'
    values weighted by B_r/G = weight/W and summed, all metrics in one small all-reduce."""
    if distributed.world_size() == 1:
        return metrics
    dtype = metrics["loss"].dtype
    values = torch.stack([value.detach().to(dtype) for value in metrics.values()])
    means = distributed.all_reduce_mean(values * weight)
    return dict(zip(metrics, means.unbind(), strict=True))


def _full_precision(tensor: torch.Tensor) -> torch.Tensor:
    """Losses in at least fp32: softmax over thousands of negatives at τ = 0.05 loses too
    much in bf16/fp16; fp64 (tests) stays fp64."""
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor
