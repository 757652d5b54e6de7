"""One training step's math: forward both views (and the hard negatives), the objective,
backward.

The objective, as `embedding_objective` and `add_mlm_term` compute it:
L = α·L_C + λ·L_R + β·L_MLM + δ·L_D + γ·L_MCR², the sum over the rows of losses/terms.py
`TERMS` (each term's weight, a `loss` setting, and how it is called; its math in its own file
of losses/; docs/LOSSES.md). α = 1 and δ = γ = 0 by default (InforMin-CL); α = 0, δ > 0 is
plain distillation from a teacher; α = 0, γ > 0 fine-tunes an encoder and its compression head
with the MCR² objective.

Kept apart from the worker's loop so the cached-gradient step (train/grad_cache.py) can replace
`plain_step`, and so tests can call exactly what the workers run. Both steps weight each rank's
loss with `rank_weight` and report `global_means`, so unequal slices of the global batch train
and log as one batch.
"""

from __future__ import annotations

import contextlib

import torch

from distributed_emb import distributed
from distributed_emb.data.collate import NEGATIVE_KEYS
from distributed_emb.losses.loss_config import LossConfig
from distributed_emb.losses.terms import MLM, VIEW_TERMS, Views


def forward_objective(
    forward_module, batch: dict[str, torch.Tensor], weights: LossConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(loss to backpropagate, metrics) for one batch (rows [0, B) first view, [B, 2B) second
    view; with hard negatives, their (B, L) block embedded in the same forward as rows
    [2B, 3B)): the loss is this rank's, weighted by rank_weight; the metrics are global means."""
    use_mlm = MLM.weight(weights) > 0 and "mlm_input_ids" in batch
    input_ids, attention_mask = embedded_rows(batch)  # (2B or 3B, L)
    outputs = forward_module(
        input_ids,
        attention_mask,
        mlm_input_ids=batch["mlm_input_ids"] if use_mlm else None,
        mlm_attention_mask=batch["mlm_attention_mask"] if use_mlm else None,
    )
    z, logits = outputs if use_mlm else (outputs, None)
    z1, z2, negatives = split_embeddings(_full_precision(z), has_negatives(batch))  # (B, d) each
    sizes = distributed.gather_sizes(z1.shape[0])  # for the weight and L_C's gathers
    loss, metrics = embedding_objective(
        z1, z2, weights, batch.get("groups"), batch.get("teacher_vectors"), sizes, negatives
    )
    weight = rank_weight(sizes)
    mlm = MLM.compute(_full_precision(logits), batch["mlm_labels"]) if use_mlm else None
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


def has_negatives(batch: dict[str, torch.Tensor]) -> bool:
    """The batch carries a hard negative a row (data.negative_column, data/collate.py)."""
    return NEGATIVE_KEYS[0] in batch


def embedded_rows(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of every row the encoder embeds: the (2B, L) views, then
    the (B, L) hard negatives when the batch has them ((3B, L): one forward, one set of
    collectives under DDP/ZeRO, as for the views alone)."""
    if not has_negatives(batch):
        return batch["input_ids"], batch["attention_mask"]
    ids, mask = NEGATIVE_KEYS
    return (
        torch.cat([batch["input_ids"], batch[ids]]),
        torch.cat([batch["attention_mask"], batch[mask]]),
    )


def split_embeddings(
    z: torch.Tensor, negatives: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(2B, d) or, with hard negatives, (3B, d) embeddings in embedded_rows' order → z1, z2
    and the negatives' z (None without), (B, d) each."""
    if negatives:
        z1, z2, z_negative = z.chunk(3)
        return z1, z2, z_negative
    z1, z2 = z.chunk(2)
    return z1, z2, None


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


def embedding_objective(
    z1: torch.Tensor,
    z2: torch.Tensor,
    weights: LossConfig,
    groups: torch.Tensor | None = None,
    teacher_vectors: torch.Tensor | None = None,
    sizes: list[int] | None = None,
    negatives: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The embedding terms α·L_C + λ·L_R + δ·L_D + γ·L_MCR² (losses/terms.py `VIEW_TERMS`, in
    that order) on (B, d) views (`teacher_vectors`: the teacher's (2B, D) vectors of the rows
    behind z1 then z2, needed by δ and by MCR²'s μ; `groups` (B,): the rows' documents,
    negatives to no one in L_C, MCR²'s clusters Π; `sizes`: every rank's B, where the step
    already gathered them, for L_C's gathers; `negatives` (B, d): the rows' hard negatives,
    extra candidates of L_C alone: the other terms read the views only); metrics stay tensors
    (no host sync) except MCR²'s. A term of weight 0 is not computed (α = 0: no gather, no
    similarity matrix)."""
    views = Views(z1, z2, groups, teacher_vectors, sizes, negatives)
    loss = z1.new_zeros(())
    metrics = {}
    for term in VIEW_TERMS:
        weight = term.weight(weights)
        if weight > 0:
            value, term_metrics = term.compute(views, weights)
            loss = loss + weight * value
            metrics.update(term_metrics)
    return loss, metrics


def add_mlm_term(
    loss: torch.Tensor, metrics: dict, mlm: torch.Tensor | None, weights: LossConfig
) -> torch.Tensor:
    """β·L_MLM (losses/terms.py `MLM`) added to the embedding terms' `loss`; its metric too."""
    weight = MLM.weight(weights)
    if mlm is None or weight == 0:
        return loss
    metrics["loss_mlm"] = mlm.detach()
    return loss + weight * mlm
