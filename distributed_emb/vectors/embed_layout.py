"""How the embed job lays its encoding actors over the cluster: how many, the threads each runs
and what each reserves, decided from the cluster's nodes for what `embed.*` leaves null.

- One CPU node: one actor whose threads are every core of the node. On a 2-core machine two
  actors of one thread each embedded at 0.69× a plain `SentenceTransformer.encode` using both
  cores (issue #56; docs/BENCHMARKS.md, "Embedding a corpus"): a second actor is a second model
  copy and a second process for the same cores, where one process's intra-op threads do the
  same work without either.
- Several CPU nodes: one actor per node, every core of the smallest node as its threads (a Ray
  Data pool's actors all reserve alike).
- GPUs (`embed.backend=torch`): one actor per GPU, sharing its node's CPUs.

Each actor reserves its node's CPUs less one whole CPU, shared by the actors placed there: Ray
Data's read and write tasks each take a whole CPU, and a pool that takes every CPU starves them
(model/embedder.py `default_cpus_per_actor`). A reservation is what Ray schedules by; the threads
are what the actor runs, so one actor reserving 1 of 2 CPUs still runs 2 threads.

`embed.concurrency`, `embed.torch_threads`, `embed.num_cpus_per_actor` and
`embed.num_gpus_per_actor` override the layout one by one; with `embed.concurrency` given, the
threads and the reservations are shared out among that many actors the same way.

A pure function of a described cluster (`resource_plan.ClusterShape`, from `ray.nodes()` at run
time), so every case is tested without starting one. No torch, no Ray here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from distributed_emb.resource_plan import CPU_STEP, ClusterShape, Node
from distributed_emb.vectors.embed_config import EmbedConfig

# The least CPU reservation of an actor (a 1-CPU node, many actors on one node).
MIN_ACTOR_CPU = 0.25
# One whole CPU of a node is left to Ray Data's tasks (resource_plan.DATA_TASK_CPU).
LEFT_FOR_DATA = 1.0


@dataclass(frozen=True)
class EmbedLayout:
    """The encoding pool's shape: `concurrency` actors, each reserving `num_cpus_per_actor`
    CPUs and `num_gpus_per_actor` GPUs and running `threads` threads (torch's, or
    onnxruntime's intra-op threads); `reason`: why, in words."""

    concurrency: int
    num_cpus_per_actor: float
    num_gpus_per_actor: float
    threads: int
    reason: str
    backend: str = "torch"
    overridden: tuple[str, ...] = ()
    compute_dtype: str = "auto"  # embed.compute_dtype (the torch model's; each actor settles auto)

    @property
    def line(self) -> str:
        """The one line the job prints."""
        actors = f"{self.concurrency} actor{'s' if self.concurrency != 1 else ''}"
        threads = "torch" if self.backend == "torch" else "onnxruntime"
        threads += " thread" if self.threads == 1 else " threads"
        gpu = f" + {_num(self.num_gpus_per_actor)} GPU" if self.num_gpus_per_actor else ""
        given = (
            f"; {', '.join(f'embed.{key}' for key in self.overridden)} as set"
            if self.overridden
            else "; embed.concurrency and embed.torch_threads override it"
        )
        dtype = ""
        if self.backend == "torch":
            dtype = f", embed.compute_dtype={self.compute_dtype}"
            if self.compute_dtype == "auto":
                dtype += ": bfloat16 on a CPU with AMX, else float32"
        return (
            f"layout: {self.reason}: {actors} × {self.threads} {threads}, "
            f"{_num(self.num_cpus_per_actor)} CPU{gpu} reserved each "
            f"({self.backend}{dtype}{given})"
        )


def choose_layout(cluster: ClusterShape, embed: EmbedConfig) -> EmbedLayout:
    """The layout for `embed` on `cluster` (its alive nodes; node types an autoscaler may add
    are not counted: set embed.concurrency for those)."""
    nodes = [node for node in cluster.nodes if node.cpu > 0] or [Node(1.0)]
    gpu_nodes = []
    if embed.backend == "torch" and embed.num_gpus_per_actor != 0:
        gpu_nodes = [node for node in nodes if node.gpu >= 1]
    gpus = sum(int(node.gpu) for node in gpu_nodes)
    actors = embed.concurrency
    if gpus and (actors is None or actors <= gpus):
        layout = _one_actor_per_gpu(gpu_nodes, gpus, actors)
    else:
        layout = _cpu_actors(nodes, actors)
    concurrency, cpu, gpu, threads, reason = layout
    if cluster.autoscaling and embed.concurrency is None:
        reason += " (the alive nodes; nodes the autoscaler may add are not counted)"
    overridden = tuple(
        key
        for key in ("concurrency", "torch_threads", "num_cpus_per_actor", "num_gpus_per_actor")
        if getattr(embed, key) is not None
    )
    return EmbedLayout(
        concurrency=concurrency,
        num_cpus_per_actor=cpu if embed.num_cpus_per_actor is None else embed.num_cpus_per_actor,
        num_gpus_per_actor=gpu if embed.num_gpus_per_actor is None else embed.num_gpus_per_actor,
        threads=threads if embed.torch_threads is None else embed.torch_threads,
        reason=reason,
        backend=embed.backend,
        overridden=overridden,
        compute_dtype=embed.compute_dtype,
    )


def _one_actor_per_gpu(
    gpu_nodes: list[Node], gpus: int, actors: int | None
) -> tuple[int, float, float, int, str]:
    """An actor per GPU (or the `actors` given, at most one a GPU): each with its node's CPUs
    less one, shared by the GPUs there (the smallest such share over the GPU nodes)."""
    share = min((node.cpu - LEFT_FOR_DATA) / int(node.gpu) for node in gpu_nodes)
    threads = max(1, math.floor(min(node.cpu / int(node.gpu) for node in gpu_nodes)))
    count = gpus if actors is None else actors
    where = f"{len(gpu_nodes)} node{'s' if len(gpu_nodes) != 1 else ''}"
    reason = f"{gpus} GPU{'s' if gpus != 1 else ''} on {where}: one actor per GPU"
    return count, _reservation(share), 1.0, threads, reason


def _cpu_actors(nodes: list[Node], actors: int | None) -> tuple[int, float, float, int, str]:
    """CPU actors spread evenly over the nodes (one per node unless `actors` says more): each
    reserves its share of the smallest node's CPUs less one and runs its share of its cores."""
    smallest = min(node.cpu for node in nodes)
    count = len(nodes) if actors is None else actors
    per_node = math.ceil(count / len(nodes))
    threads = max(1, math.floor(smallest) // per_node)
    if len(nodes) == 1:
        reason = f"one CPU node ({_num(smallest)} CPU)"
        if actors is None:
            reason += ": one actor, every core as its threads"
    else:
        reason = f"{len(nodes)} CPU nodes (smallest {_num(smallest)} CPU)"
        if actors is None:
            reason += ": one actor per node, every core of the smallest as its threads"
    return count, _reservation((smallest - LEFT_FOR_DATA) / per_node), 0.0, threads, reason


def _reservation(cpus: float) -> float:
    """`cpus` down to Ray's grid of CPU_STEP, at least MIN_ACTOR_CPU."""
    return max(MIN_ACTOR_CPU, round(math.floor(cpus / CPU_STEP + 1e-9) * CPU_STEP, 4))


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def cluster_layout(embed: EmbedConfig) -> EmbedLayout:
    """:func:`choose_layout` on the cluster Ray is connected to (its alive nodes)."""
    from distributed_emb.resource_plan import cluster_from_ray

    return choose_layout(cluster_from_ray(), embed)
