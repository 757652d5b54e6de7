"""`train.layout=auto`: how many Train processes carry the global batch on one node.

The method needs a global batch (num_workers × batch_size rows whose second views are every
row's negatives); how many processes compute it is a speed choice:
- CPU-only node: one worker holding the whole global batch, with every core as its torch
  threads: no gloo all-reduce of every gradient and no gather per step. On 2 idle cores this
  has not yet been measured faster than 2 workers × 1 thread (two OpenMP threads scale worse
  than two processes: docs/BENCHMARKS.md, "Fast by default"), so it is not the default there.
- GPU node: one worker per GPU, the global batch split evenly between them.
- Several nodes, or a global batch the GPUs cannot split evenly: the layout as set.

`train.layout=as_set` (the built-in default) takes num_workers, batch_size, cpus_per_worker
and torch_threads exactly as configured.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import ray
import torch

from distributed_emb.train.train_config import TrainLoopConfig

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class NodeShape:
    """What the layout is decided from: the CPUs and GPUs of the node, and how many nodes."""

    cpus: int
    gpus: int
    nodes: int = 1


def auto_layout(train: TrainLoopConfig, node: NodeShape) -> tuple[dict, str]:
    """(the fields of `train` to change, a one-line reason) for train.layout=auto; the global
    batch (num_workers × batch_size) never changes."""
    global_batch = train.global_batch
    if train.elastic:
        return {}, "an elastic group (train.num_workers is a range): as set"
    if node.nodes > 1:
        return {}, f"{node.nodes} nodes: the layout as set"
    if train.use_gpu:
        gpus = max(1, node.gpus)
        if global_batch % gpus:
            return {}, f"global batch {global_batch} does not split over {gpus} GPUs: as set"
        return (
            {"num_workers": gpus, "batch_size": global_batch // gpus},
            f"one worker per GPU ({gpus}) × {global_batch // gpus}",
        )
    changes = {"num_workers": 1, "batch_size": global_batch}
    # The reservation leaves Ray Data its CPUs; the threads use every core (the data path
    # needs a fraction of one: docs/BENCHMARKS.md, section 4).
    changes["cpus_per_worker"] = float(max(1, node.cpus - int(train.data_cpus)))
    if train.torch_threads is None:
        changes["torch_threads"] = max(1, node.cpus)
    threads = changes.get("torch_threads", train.torch_threads)
    return changes, f"CPU node: 1 worker × {global_batch} rows, {threads} torch threads"


def local_node_shape() -> NodeShape:
    """The node's shape from Ray when it is running (a joined cluster's alive nodes), else
    this machine's cores and visible GPUs."""
    try:
        if ray.is_initialized():
            nodes = [n for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU")]
            if nodes:
                biggest = max(nodes, key=lambda n: n["Resources"].get("CPU", 0))
                return NodeShape(
                    cpus=int(biggest["Resources"].get("CPU", 1)),
                    gpus=int(biggest["Resources"].get("GPU", 0)),
                    nodes=len(nodes),
                )
    except Exception as error:  # pragma: no cover - Ray's API shape; fall back to this node
        log.debug("no node shape from Ray: %s", error)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpus = 0
    try:
        gpus = torch.cuda.device_count()
    except Exception:  # pragma: no cover
        pass
    return NodeShape(cpus=cpus or 1, gpus=gpus)


def apply_layout(train: TrainLoopConfig, node: NodeShape | None = None) -> str | None:
    """Resolve train.layout=auto in place (then it reads as_set); the line to log, or None."""
    if train.layout != "auto":
        return None
    changes, reason = auto_layout(train, node or local_node_shape())
    for name, value in changes.items():
        setattr(train, name, value)
    train.layout = "as_set"
    return (
        f"layout: {reason} (train.layout=auto; num_workers={train.num_workers}, "
        f"batch_size={train.batch_size}, cpus_per_worker={train.cpus_per_worker}, "
        f"torch_threads={train.torch_threads})"
    )
