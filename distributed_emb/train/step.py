"""One training step's math: forward both views (and the hard negatives), the objective,
backward.

The objective, as `embedding_objective` and `add_mlm_term` compute it:
L = α·L_C + λ·L_R + β·L_MLM + δ·L_D + γ·L_MCR², each term in its own file of losses/
(info_nce, reconstruction, mlm, distillation, mcr2) and its weight a `loss` setting
(losses/loss_config.py; docs/LOSSES.md). α = 1 and δ = γ = 0 by default (InforMin-CL);
α = 0, δ > 0 is plain distillation from a teacher; α = 0, γ > 0 fine-tunes an encoder and its
compression head with the MCR² objective.

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
from distributed_emb.losses.distillation import distillation_loss
from distributed_emb.losses.info_nce import info_nce_loss
from distributed_emb.losses.loss_config import LossConfig, MCR2LossConfig
from distributed_emb.losses.mcr2 import MCR2Loss
from distributed_emb.losses.mlm import mlm_loss
from distributed_emb.losses.reconstruction import reconstruction_loss


def forward_objective(
    forward_module, batch: dict[str, torch.Tensor], weights: LossConfig
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(loss to backpropagate, metrics) for one batch (rows [0, B) first view, [B, 2B) second
    view; with hard negatives, their (B, L) block embedded in the same forward as rows
    [2B, 3B)): the loss is this rank's, weighted by rank_weight; the metrics are global means."""
    use_mlm = weights.mlm_weight > 0 and "mlm_input_ids" in batch
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
    """The embedding terms α·L_C + λ·L_R + δ·L_D + γ·L_MCR² on (B, d) views (`teacher_vectors`:
    the teacher's (2B, D) vectors of the rows behind z1 then z2, needed by δ and by MCR²'s μ;
    `groups` (B,): the rows' documents, negatives to no one in L_C, MCR²'s clusters Π;
    `sizes`: every rank's B, where the step already gathered them, for L_C's gathers;
    `negatives` (B, d): the rows' hard negatives, extra candidates of L_C alone: the other
    terms read the views only); metrics stay tensors (no host sync) except MCR²'s."""
    loss = z1.new_zeros(())
    metrics = {}
    if weights.contrastive_weight > 0:  # α = 0: no gather, no similarity matrix
        contrastive = info_nce_loss(
            z1, z2, weights.temperature, weights.gather_negatives, groups, sizes, negatives
        )
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
    if weights.mcr2_weight > 0:
        mcr2, mcr2_metrics = mcr2_term(z1, z2, weights.mcr2, groups, teacher_vectors)
        loss = loss + weights.mcr2_weight * mcr2
        metrics.update({f"mcr2_{k}": z1.new_tensor(v) for k, v in mcr2_metrics.items()})
    return loss, metrics


def mcr2_term(
    z1: torch.Tensor,
    z2: torch.Tensor,
    config: MCR2LossConfig,
    groups: torch.Tensor | None,
    teacher_vectors: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The MCR² loss of the compression job's heads on this worker's first view z1 (B, d):
    clusters = the rows' groups, the pair term between the two dropout views, the teacher's
    rows of z1 for the neighbourhood term. Per worker, like the frozen-encoder heads' batches:
    logdets of a gathered batch would need every worker's rows with gradients; DDP averages
    the workers' gradients, i.e. of the mean of their losses."""
    if groups is None:
        if config.compress_weight > 0:
            raise ValueError("the MCR² term needs each row's group (data.group_column)")
        groups = torch.zeros(len(z1), dtype=torch.long, device=z1.device)
    teacher = None
    if config.distill_weight > 0:
        if teacher_vectors is None:
            raise ValueError("loss.mcr2.distill_weight > 0 but the batch has no teacher vectors")
        teacher = teacher_vectors[: len(z1)].to(z1.dtype)  # the rows behind z1
    return MCR2Loss(config)(z1, groups, (z1, z2), teacher=teacher)


def add_mlm_term(
    loss: torch.Tensor, metrics: dict, mlm: torch.Tensor | None, weights: LossConfig
) -> torch.Tensor:
    if mlm is None or weights.mlm_weight == 0:
        return loss
    metrics["loss_mlm"] = mlm.detach()
    return loss + weights.mlm_weight * mlm
