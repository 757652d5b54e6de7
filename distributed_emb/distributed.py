"""Every torch.distributed call in the project lives here (contriever's dist_utils pattern).

Losses call `gather_with_grad(z)` and `rank()`; they never ask how the processes were started,
so the same loss runs in one process, under DDP, or under DeepSpeed.
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


class _GatherWithGrad(torch.autograd.Function):
    """all_gather whose backward hands each rank the summed gradient of its own slice.

    Every rank's loss depends on every rank's rows, so the gradient w.r.t. this rank's rows is
    the sum over ranks of ∂loss_r/∂rows. Summing here and letting DDP average parameter
    gradients gives exactly the gradient of the mean loss over the global batch.
    """

    @staticmethod
    def forward(ctx, tensor: torch.Tensor) -> torch.Tensor:
        ctx.batch = tensor.shape[0]
        gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, tensor.contiguous())
        return torch.cat(gathered, dim=0)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> torch.Tensor:
        grad = grad_output.contiguous()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        start = dist.get_rank() * ctx.batch
        return grad[start : start + ctx.batch]


def gather_with_grad(tensor: torch.Tensor) -> torch.Tensor:
    """(B, …) on each rank → (W·B, …) on every rank, rank r's rows at [r·B, (r+1)·B).

    All ranks must pass the same B (the training loop keeps per-worker batches equal).
    """
    if world_size() == 1:
        return tensor
    return _GatherWithGrad.apply(tensor)


def gather_no_grad(tensor: torch.Tensor) -> torch.Tensor:
    """(B, …) → (W·B, …) without autograd (ids, labels, cached embeddings)."""
    if world_size() == 1:
        return tensor
    gathered = [torch.empty_like(tensor) for _ in range(world_size())]
    dist.all_gather(gathered, tensor.contiguous())
    return torch.cat(gathered, dim=0)


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
    value = torch.tensor([1 if flag else 0], dtype=torch.int32)
    if dist.get_backend() == "nccl":
        value = value.cuda()
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return bool(value.item())
