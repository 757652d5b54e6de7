"""One resource plan per job: what each part takes, checked against the cluster before Ray
Train is asked for anything.

Parts of a training job (docs/OPERATIONS.md, "Sizing a cluster"):
- Ray Train workers: `train.num_workers` bundles of `train.cpus_per_worker` CPUs (+1 GPU each
  with `train.use_gpu`), held for the whole run (an elastic [min, max] group: `min` must fit);
- Ray Data's share, `train.data_cpus`: the tasks that read, clean and feed the corpus. Ray
  Train V2 subtracts its workers' bundles from Ray Data's budget and every Ray Data task asks
  for a whole CPU, so at least one node must keep a whole CPU free of Train workers, or the
  pipeline waits forever (a 2-CPU head with 2 workers × 1 CPU: `Split Repartition: 0%`);
- per job extras: annotation and encoding actors. (Tune's trial drivers reserve memory, not
  CPU: tune/driver.py.)

Fit or fail: on a fixed cluster a plan that cannot fit raises `PlanError` with the arithmetic
and the smallest change that fits. Where only the CPUs are short and
`train.lower_cpus_to_fit` is on (the default), the plan lowers each worker's CPU reservation to
the largest fraction (at least MIN_WORKER_CPU) that leaves Ray Data its share: Ray only
schedules by these numbers, the worker's torch threads stay as configured. On an
autoscaling cluster (the autoscaler publishes its node types) a plan that fits once nodes are
added proceeds: Ray Train's request is what makes the autoscaler add them, and the stall
watchdog (watchdog.py) fails the run if they never come.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field

from distributed_emb.console import RepeatFilter

log = logging.getLogger(__name__)
# An evaluation starts an encoding pool per task, each with the same plan: its table is shown
# once, then counted.
pool_log = logging.getLogger(f"{__name__}.pools")
pool_log.addFilter(RepeatFilter())

# A worker's CPU reservation is never lowered below this: under it the plan fails instead and
# names the fix (fewer workers, or more CPUs).
MIN_WORKER_CPU = 0.25
# Every Ray Data task (read, clean, select rank) asks Ray for one whole CPU on one node.
DATA_TASK_CPU = 1.0
# Grid of lowered CPU reservations: Ray keeps resources to 1/10000, users read 2 decimals.
CPU_STEP = 0.05
# Upper bound on hypothetical nodes per autoscaler node type ("unbounded" types).
MAX_NODES_PER_TYPE = 256
_EPS = 1e-9


class PlanError(RuntimeError):
    """The job can never fit this cluster; the message has the arithmetic and the fix."""


@dataclass(frozen=True)
class Node:
    cpu: float
    gpu: float = 0.0
    name: str = "node"


@dataclass
class ClusterShape:
    """The alive nodes, plus node types the autoscaler may add (empty: a fixed cluster)."""

    nodes: list[Node]
    # (node type name, its resources, the most nodes of it) from the autoscaler's config.
    node_types: list[tuple[str, Node, int]] = field(default_factory=list)
    # An autoscaler runs but publishes no node types (Ray's v1 autoscaler, which `ray up`
    # runs): the cluster may grow by an unknown amount.
    unknown_growth: bool = False

    @property
    def autoscaling(self) -> bool:
        return self.unknown_growth or any(count > 0 for _, _, count in self.node_types)

    @property
    def cpu(self) -> float:
        return sum(n.cpu for n in self.nodes)

    @property
    def gpu(self) -> float:
        return sum(n.gpu for n in self.nodes)

    def largest(self) -> list[Node]:
        """The alive nodes plus every node the autoscaler may add (an upper bound)."""
        added = [
            Node(shape.cpu, shape.gpu, name)
            for name, shape, count in self.node_types
            for _ in range(min(count, MAX_NODES_PER_TYPE))
        ]
        return self.nodes + added

    def describe(self) -> str:
        text = (
            f"{len(self.nodes)} node{'s' if len(self.nodes) != 1 else ''}, "
            f"{_num(self.cpu)} CPU, {_num(self.gpu)} GPU"
        )
        if self.unknown_growth and not self.node_types:
            return f"{text}; autoscaling (node types not published)"
        if self.autoscaling:
            types = ", ".join(
                f"{name} ≤{count} × {_num(s.cpu)} CPU/{_num(s.gpu)} GPU"
                for name, s, count in self.node_types
            )
            return f"{text}; autoscaling: {types}"
        return f"{text}; fixed size"


@dataclass(frozen=True)
class Extra:
    """A part of the job besides Train workers and Ray Data (Tune drivers, actors)."""

    label: str
    count: int
    cpu: float
    gpu: float = 0.0


@dataclass
class ResourcePlan:
    workers: int
    worker_cpu: float  # what each Train worker reserves (may be lowered, see module doc)
    asked_cpu: float  # train.cpus_per_worker
    worker_gpu: float
    data_cpus: float
    extras: list[Extra]
    cluster: ClusterShape
    fits_now: bool
    needs_nodes: bool = False  # fits only once the autoscaler adds nodes
    problem: str | None = None  # why it can never fit, with the fix

    @property
    def lowered(self) -> bool:
        return self.worker_cpu < self.asked_cpu - _EPS

    def totals(self) -> tuple[float, float]:
        cpu = self.workers * self.worker_cpu + self.data_cpus
        gpu = self.workers * self.worker_gpu
        for extra in self.extras:
            cpu += extra.count * extra.cpu
            gpu += extra.count * extra.gpu
        return cpu, gpu

    def table(self) -> str:
        """The short table printed at the start of every run and by `--plan`."""
        rows = [("part", "count", "CPU each", "GPU each", "CPU", "GPU", "")]
        note = (
            f"train.cpus_per_worker={_num(self.asked_cpu)} lowered to leave Ray Data its share"
            if self.lowered
            else "train.num_workers × train.cpus_per_worker"
        )
        if self.workers:  # a pool plan (pool_plan) has no Train workers
            rows.append(
                (
                    "Ray Train workers",
                    str(self.workers),
                    _num(self.worker_cpu),
                    _num(self.worker_gpu),
                    _num(self.workers * self.worker_cpu),
                    _num(self.workers * self.worker_gpu),
                    note,
                )
            )
        rows.append(
            (
                "Ray Data (read/clean/feed)",
                "-",
                _num(DATA_TASK_CPU),
                "0",
                _num(self.data_cpus),
                "0",
                "train.data_cpus; whole-CPU tasks",
            )
        )
        for extra in self.extras:
            rows.append(
                (
                    extra.label,
                    str(extra.count),
                    _num(extra.cpu),
                    _num(extra.gpu),
                    _num(extra.count * extra.cpu),
                    _num(extra.count * extra.gpu),
                    "",
                )
            )
        cpu, gpu = self.totals()
        rows.append(
            ("total", "", "", "", _num(cpu), _num(gpu), f"cluster: {self.cluster.describe()}")
        )
        widths = [max(len(row[i]) for row in rows) for i in range(6)]
        lines = ["resource plan:"]
        for row in rows:
            cells = [row[0].ljust(widths[0])] + [row[i].rjust(widths[i]) for i in range(1, 6)]
            lines.append("  " + "  ".join(cells) + (f"  {row[6]}" if row[6] else ""))
        if self.problem:
            lines.append(f"  does not fit: {self.problem}")
        elif self.needs_nodes:
            lines.append(
                "  fits once the autoscaler adds nodes (waits up to train.stall_timeout_s)"
            )
        else:
            lines.append("  fits")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Fitting
# ---------------------------------------------------------------------------------------------


def _place(nodes: list[Node], count: int, cpu: float, gpu: float, free: list[list[float]]) -> bool:
    """Best fit: each bundle on the node with the least room that still holds it (packs, as
    Ray Train's PACK strategy does, and leaves the largest holes for Ray Data)."""
    for _ in range(count):
        best = None
        for index, (free_cpu, free_gpu) in enumerate(free):
            if free_cpu + _EPS >= cpu and free_gpu + _EPS >= gpu:
                if best is None or (free_cpu, free_gpu) < tuple(free[best]):
                    best = index
        if best is None:
            return False
        free[best][0] -= cpu
        free[best][1] -= gpu
    return True


def fits(
    nodes: list[Node],
    workers: int,
    worker_cpu: float,
    worker_gpu: float,
    data_cpus: float,
    extras: list[Extra] = (),
) -> bool:
    """Can these nodes hold every part at once, with Ray Data's share left on whole CPUs?"""
    free = [[n.cpu, n.gpu] for n in nodes]
    if not _place(nodes, workers, worker_cpu, worker_gpu, free):
        return False
    for extra in extras:
        if not _place(nodes, extra.count, extra.cpu, extra.gpu, free):
            return False
    # Ray Data: data_cpus in all, in whole-CPU tasks, each on one node.
    whole = sum(math.floor(f[0] + _EPS) for f in free)
    return whole + _EPS >= data_cpus and whole >= DATA_TASK_CPU


def _largest_cpu(nodes, workers, asked, gpu, data_cpus, extras) -> float | None:
    """The largest reservation ≤ `asked`, on the CPU_STEP grid and ≥ MIN_WORKER_CPU, that fits."""
    steps = math.floor(asked / CPU_STEP + _EPS)
    for k in range(steps, 0, -1):
        cpu = round(k * CPU_STEP, 4)
        if cpu < MIN_WORKER_CPU - _EPS:
            return None
        if fits(nodes, workers, cpu, gpu, data_cpus, extras):
            return cpu
    return None


def _most_workers(nodes, workers, cpu, gpu, data_cpus, extras) -> int:
    return max(
        (k for k in range(workers, 0, -1) if fits(nodes, k, cpu, gpu, data_cpus, extras)),
        default=0,
    )


def compute_plan(
    cluster: ClusterShape,
    workers: int,
    cpus_per_worker: float,
    use_gpu: bool,
    data_cpus: float,
    lower_cpus_to_fit: bool = True,
    extras: list[Extra] = (),
) -> ResourcePlan:
    """The plan for these parts on `cluster` (pure: no Ray calls)."""
    gpu = 1.0 if use_gpu else 0.0
    extras = list(extras)
    plan = ResourcePlan(
        workers, cpus_per_worker, cpus_per_worker, gpu, data_cpus, extras, cluster, False
    )
    for nodes, later in ((cluster.nodes, False), (cluster.largest(), True)):
        if later and not cluster.autoscaling:
            break
        if later and cluster.unknown_growth and not cluster.node_types:
            # Nothing to check against: Ray Train's request makes the autoscaler add nodes,
            # and the stall watchdog fails the run if none that fit ever come.
            plan.needs_nodes = True
            return plan
        cpu = cpus_per_worker
        ok = fits(nodes, workers, cpu, gpu, data_cpus, extras)
        if not ok and lower_cpus_to_fit:
            lowered = _largest_cpu(nodes, workers, cpus_per_worker, gpu, data_cpus, extras)
            if lowered is not None:
                cpu, ok = lowered, True
        if ok:
            plan.worker_cpu = cpu
            plan.fits_now = not later
            plan.needs_nodes = later
            return plan
    plan.problem = _explain(plan, lower_cpus_to_fit)
    return plan


def pool_plan(
    cluster: ClusterShape, pool: Extra, data_cpus: float = DATA_TASK_CPU, fix: str = ""
) -> ResourcePlan:
    """The plan for an actor pool that runs on its own (InfoCSE annotation between training
    rounds): its actors placed on nodes, and one whole CPU left for the Ray Data tasks that
    read its input and write its output, without which the pool's input never arrives and
    the job waits forever. The fit is compute_plan's with no Train workers; only the message
    differs. `fix`: the config keys that size the pool."""
    plan = compute_plan(cluster, 0, 0.0, False, data_cpus, lower_cpus_to_fit=False, extras=[pool])
    if plan.problem is None:
        return plan
    nodes = cluster.largest() if cluster.autoscaling else cluster.nodes
    where = "even with every node the autoscaler may add" if cluster.autoscaling else "this cluster"
    gpu = f" (+{_num(pool.gpu)} GPU)" if pool.gpu else ""
    plan.problem = (
        f"{pool.count} {pool.label} × {_num(pool.cpu)} CPU{gpu} + Ray Data {_num(data_cpus)} CPU "
        f"(its read and write tasks, whole CPUs) = {_num(pool.count * pool.cpu + data_cpus)} CPU; "
        f"{where} has {_num(sum(n.cpu for n in nodes))} CPU on {len(nodes)} "
        f"node{'s' if len(nodes) != 1 else ''}"
        + (f" (largest: {_num(max(n.cpu for n in nodes))} CPU)" if nodes else "")
        + (f". Lower {fix}" if fix else "")
    )
    return plan


def check_pool_plan(pool: Extra, fix: str = "") -> ResourcePlan:
    """pool_plan on the connected cluster: log its table, raise PlanError if it can never fit."""
    plan = pool_plan(cluster_from_ray(), pool, fix=fix)
    pool_log.info("%s", plan.table())
    if plan.problem:
        raise PlanError(f"the {pool.label} do not fit the cluster: {plan.problem}")
    return plan


def _explain(plan: ResourcePlan, lower_cpus_to_fit: bool) -> str:
    """The arithmetic of the shortfall and the smallest changes that fit."""
    cluster = plan.cluster
    nodes = cluster.largest() if cluster.autoscaling else cluster.nodes
    where = "even with every node the autoscaler may add" if cluster.autoscaling else "this cluster"
    extras_cpu = sum(e.count * e.cpu for e in plan.extras)
    need_cpu = plan.workers * plan.asked_cpu + plan.data_cpus + extras_cpu
    need_gpu = plan.workers * plan.worker_gpu + sum(e.count * e.gpu for e in plan.extras)
    have_cpu = sum(n.cpu for n in nodes)
    have_gpu = sum(n.gpu for n in nodes)
    parts = [
        f"{plan.workers} Train workers × {_num(plan.asked_cpu)} CPU"
        + (f" (+{_num(plan.worker_gpu)} GPU)" if plan.worker_gpu else "")
        + f" + Ray Data {_num(plan.data_cpus)} CPU"
        + (f" + {_num(extras_cpu)} CPU for " + ", ".join(e.label for e in plan.extras))
        * bool(plan.extras)
        + f" = {_num(need_cpu)} CPU"
        + (f", {_num(need_gpu)} GPU" if need_gpu else "")
        + f"; {where} has {_num(have_cpu)} CPU"
        + (f", {_num(have_gpu)} GPU" if need_gpu else "")
        + f" on {len(nodes)} node{'s' if len(nodes) != 1 else ''}"
        + (f" (largest: {_num(max(n.cpu for n in nodes))} CPU)" if nodes else "")
    ]
    if need_cpu <= have_cpu + _EPS and need_gpu <= have_gpu + _EPS:
        parts.append(
            "the totals would do, but no node keeps a whole CPU free for Ray Data's tasks "
            "(each takes 1 CPU on one node) once the workers are placed"
        )
    fixes = []
    args = (plan.asked_cpu, plan.worker_gpu, plan.data_cpus, plan.extras)
    most = _most_workers(nodes, plan.workers, *args)
    if most:
        fixes.append(f"train.num_workers={most}")
    lowered = None
    for k in range(math.floor(plan.asked_cpu / CPU_STEP + _EPS), 0, -1):
        cpu = round(k * CPU_STEP, 4)
        if fits(nodes, plan.workers, cpu, plan.worker_gpu, plan.data_cpus, plan.extras):
            lowered = cpu
            break
    if lowered is not None:
        fix = f"train.cpus_per_worker={_num(lowered)}"
        if lower_cpus_to_fit and lowered < MIN_WORKER_CPU:
            fix += f" (below the {MIN_WORKER_CPU} the plan lowers to by itself)"
        elif not lower_cpus_to_fit:
            fix += " (or train.lower_cpus_to_fit=true)"
        fixes.append(fix)
    cpu_short = max(need_cpu - have_cpu, 0.0)
    if need_gpu > have_gpu + _EPS:
        fixes.append(f"{_num(need_gpu - have_gpu)} more GPU")
    if cpu_short > _EPS or not fixes:
        fixes.append(
            f"{_num(max(math.ceil(cpu_short), 1))} more CPU"
            + ("" if cpu_short > _EPS else " on one node (for Ray Data's whole-CPU tasks)")
        )
    return "; ".join(parts) + ". Smallest changes that fit: " + ", or ".join(fixes)


def _num(value: float) -> str:
    if value is None:
        return "-"
    if abs(value - round(value)) < _EPS:
        return str(int(round(value)))
    return f"{value:.2f}".rstrip("0")


# ---------------------------------------------------------------------------------------------
# From config + a running Ray
# ---------------------------------------------------------------------------------------------


def cluster_from_ray() -> ClusterShape:
    """The cluster Ray is connected to: alive nodes' totals, and the autoscaler's node types
    when it published any (`ray up` clusters; a plain `ray start` cluster has none)."""
    import ray  # startup
    from ray.experimental.internal_kv import _internal_kv_get  # private

    nodes = [
        Node(
            float(n["Resources"].get("CPU", 0.0)),
            float(n["Resources"].get("GPU", 0.0)),
            n.get("NodeManagerAddress", "node"),
        )
        for n in ray.nodes()
        if n.get("Alive")
    ]
    node_types = []
    try:
        from ray._private.state import state  # private

        config = state.get_cluster_config()
    except Exception as error:  # an older GCS or no autoscaler: treat as fixed
        log.debug("no autoscaler config: %s", error)
        config = None
    if config is not None:
        for group in config.node_group_configs:
            count = group.max_count if group.max_count >= 0 else MAX_NODES_PER_TYPE
            resources = dict(group.resources)
            shape = Node(float(resources.get("CPU", 0)), float(resources.get("GPU", 0)))
            node_types.append((group.name, shape, int(count)))
    unknown_growth = config is None and _v1_autoscaler_runs(_internal_kv_get)
    return ClusterShape(nodes, node_types, unknown_growth)


def _v1_autoscaler_runs(kv_get) -> bool:
    """Ray's v1 autoscaler (what `ray up` runs) publishes no node types, only its status. Every
    head's monitor writes a report; on a plain head it names each node `node_<id>`, while an
    autoscaler names them by the launcher config's node types."""
    try:
        raw = kv_get("__autoscaling_status")
        report = (json.loads(raw) if raw else {}).get("autoscaler_report") or {}
    except Exception as error:  # an unreadable status says nothing either way
        log.debug("no autoscaler status: %s", error)
        return False
    names = set()
    for key in ("active_nodes", "idle_nodes", "pending_launches", "pending_nodes"):
        value = report.get(key) or {}
        names.update(value if isinstance(value, dict) else [])
    return any(not str(name).startswith("node_") for name in names)


def training_plan(config, cluster: ClusterShape, extras: list[Extra] = ()) -> ResourcePlan:
    t = config.train
    # An elastic group ([min, max]) starts once `min` workers fit and grows as nodes come:
    # fitting `min` is what the run needs; the rest is the autoscaler's to add.
    return compute_plan(
        cluster,
        t.min_workers,
        t.cpus_per_worker,
        t.use_gpu,
        t.data_cpus,
        t.lower_cpus_to_fit,
        extras,
    )


def check_training_plan(config, extras: list[Extra] = ()) -> ResourcePlan | None:
    """Compute the plan on the connected cluster, log its table, raise PlanError if it can
    never fit (before Ray Train is asked for anything). None when Ray is not up (there is no
    cluster to plan for: callers that stub out Ray Train)."""
    import ray  # startup

    if not ray.is_initialized():
        return None
    plan = training_plan(config, cluster_from_ray(), extras)
    log.info("%s", plan.table())
    if plan.problem:
        raise PlanError(f"the job does not fit the cluster: {plan.problem}")
    return plan
