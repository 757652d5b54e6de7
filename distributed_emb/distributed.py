"""Every torch.distributed call in the project lives here (contriever's dist_utils pattern).

Losses call `gather_with_grad(z)` and `row_offset(sizes)`; they never ask how the processes were
started, so the same loss runs in one process, under DDP, or under DeepSpeed. The ranks may
hold different numbers of rows (an elastic group whose size does not divide the global batch):
the gathers pad, gather and trim.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def is_main_process() -> bool:
    return rank() == 0


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def gather_sizes(rows: int) -> list[int]:
    """Every rank's `rows` (its tensor's first dimension), in rank order: one tiny all-gather.

    The ranks of an elastic group hold ⌊G/W⌋ or ⌈G/W⌉ rows of the global batch; a loss that
    gathers several tensors of one batch asks once and passes the answer to each gather.
    """
    if world_size() == 1:
        return [rows]
    local = torch.tensor([rows], dtype=torch.long, device=_collective_device())
    sizes = [torch.empty_like(local) for _ in range(world_size())]
    dist.all_gather(sizes, local)
    return [int(size) for size in torch.cat(sizes).tolist()]


def row_offset(sizes: list[int]) -> int:
    """This rank's first row in a gathered batch (`sizes` from gather_sizes): ranks' rows come
    in rank order, so the offset is the sum of the earlier ranks' sizes."""
    return sum(sizes[: rank()])


def _all_gather_rows(tensor: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """(sizes[rank], …) on each rank → (Σ sizes, …), rank order. all_gather needs one shape on
    every rank, so smaller slices are padded to the largest and trimmed after: equal slices
    (the usual case) send exactly what a plain all_gather would."""
    rows = tensor.shape[0]
    if len(sizes) != world_size() or sizes[rank()] != rows:
        raise ValueError(
            f"gather on rank {rank()}: the tensor has {rows} rows but sizes are {sizes} "
            f"for {world_size()} ranks"
        )
    largest = max(sizes)
    tensor = tensor.contiguous()
    if rows < largest:
        tensor = torch.cat([tensor, tensor.new_zeros((largest - rows, *tensor.shape[1:]))])
    gathered = [torch.empty_like(tensor) for _ in sizes]
    dist.all_gather(gathered, tensor)
    if min(sizes) < largest:
        gathered = [part[:size] for part, size in zip(gathered, sizes, strict=True)]
    return torch.cat(gathered, dim=0)


class _GatherWithGrad(torch.autograd.Function):
    """all_gather whose backward hands each rank the summed gradient of its own slice.

    Every rank's loss depends on every rank's rows, so the gradient w.r.t. this rank's rows is
    the sum over ranks of ∂loss_r/∂rows. Summing here and letting DDP average parameter
    gradients gives exactly the gradient of the mean of the ranks' losses; with unequal slices
    the step weights each rank's loss so that this is the mean over the global batch
    (train/step.py rank_weight).
    """

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        ctx.start, ctx.rows = row_offset(sizes), tensor.shape[0]
        return _all_gather_rows(tensor, sizes)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad_output.contiguous()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad[ctx.start : ctx.start + ctx.rows], None


def gather_with_grad(tensor: torch.Tensor, sizes: list[int] | None = None) -> torch.Tensor:
    """(B_r, …) on each rank r → (Σ_r B_r, …) on every rank, rank r's rows at
    [row_offset(sizes), row_offset(sizes) + B_r); gradients flow back to each rank's own rows.

    The ranks may hold different numbers of rows. `sizes` (gather_sizes: every rank's B_r)
    saves the tiny size gather this makes without it.
    """
    if world_size() == 1:
        return tensor
    sizes = gather_sizes(tensor.shape[0]) if sizes is None else sizes
    return _GatherWithGrad.apply(tensor, sizes)


def gather_no_grad(tensor: torch.Tensor, sizes: list[int] | None = None) -> torch.Tensor:
    """(B_r, …) → (Σ_r B_r, …) without autograd (ids, labels, cached embeddings); `sizes` as
    in gather_with_grad."""
    if world_size() == 1:
        return tensor
    sizes = gather_sizes(tensor.shape[0]) if sizes is None else sizes
    return _all_gather_rows(tensor, sizes)


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    if world_size() > 1:
        tensor = tensor.clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    return all_reduce_sum(tensor) / world_size()


def broadcast_object(obj, src: int = 0):
    if world_size() == 1:
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=src)
    return holder[0]


def map_sharded(items: list, compute, order_key=None) -> np.ndarray:
    """`compute(items)` (an (n, ...) array, a row per item) with the items shared among the
    ranks: every rank gets the whole result, rows in item order.

    Rank r takes every W-th item (after sorting by `order_key`, so each rank gets the same mix
    of long and short ones) and its part is padded, by repeating one of its items, to the size
    of the largest part: every rank then makes the same calls in `compute`, which a collective
    inside it needs (ZeRO-3 gathers the parameters in every forward). One all-gather of the
    parts. Used for in-training evaluation, which one rank alone did while the others waited."""
    world = world_size()
    if world == 1:
        return compute(items)
    positions = list(range(len(items)))
    if order_key is not None:
        positions.sort(key=lambda i: order_key(items[i]))
    mine = positions[rank() :: world]
    size = -(-len(items) // world)  # the largest part
    padded = mine + [mine[0] if mine else 0] * (size - len(mine))
    part = np.asarray(compute([items[i] for i in padded]))[: len(mine)]
    parts: list = [None] * world
    dist.all_gather_object(parts, (mine, part))
    sample = next(rows for _, rows in parts if len(rows))  # shape and dtype of a row
    result = np.empty((len(items), *sample.shape[1:]), dtype=sample.dtype)
    for indices, rows in parts:
        result[indices] = rows
    return result


def all_ranks(flag: bool) -> bool:
    """True when `flag` is true on every rank (one tiny all-reduce; CPU tensor on gloo)."""
    if world_size() == 1:
        return flag
    value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=_collective_device())
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return bool(value.item())


def _collective_device() -> torch.device:
    """Where a small tensor made for a collective must live: NCCL only moves GPU tensors."""
    return torch.device("cuda") if dist.get_backend() == "nccl" else torch.device("cpu")
