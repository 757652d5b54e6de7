"""The one step that turns a validated training config into what a run uses, on the driver.

After `resolve_run` nothing changes the run's settings: the returned config is frozen
(settings.freeze), the Ray Train workers get it as a dict, and every later function reads it.
What the step decides:
- paths made absolute (workers run in other directories: TrainingConfig.make_paths_absolute);
- `train.layout=auto` made a concrete layout (train/layout.py), with Ray up so that it sees the
  cluster's nodes: the resource plan, the run's identity and its checkpoints all see the
  workers that will run;
- `logging.progress_bar=auto` decided by the driver's console (the workers' is a file);
- `train.max_failures` null ("auto") made a count: AUTO_MAX_FAILURES restarts on a cluster
  (the job joined a running Ray: RAY_ADDRESS or ray.address) or with object storage
  (`output.storage_path` s3://, gs://), where a node can be lost and the run resume from its
  checkpoints; 0 on one machine, where a failure is a bug to see, not a node to wait for.

Two things are decided later, where the facts are: each rank's rows of a global batch depend
on the size of the group that runs it (an elastic group's size changes; data/epoch_plan.py
split_rows), and `train.precision=auto` is timed on rank 0's device (train/precision.py).
"""

from __future__ import annotations

import copy
import logging
import os

from distributed_emb.config import TrainingConfig
from distributed_emb.evaluation.eval_config import validate_selection
from distributed_emb.selection import AUTO
from distributed_emb.settings import freeze, is_frozen
from distributed_emb.storage import is_remote
from distributed_emb.train.layout import apply_layout
from distributed_emb.train.progress import resolve_progress_bar

log = logging.getLogger(__name__)

# train.max_failures=null on a cluster or object storage: a lost spot node (an unannounced
# loss; announced preemptions have Ray Train's own unlimited budget) is retried this often.
AUTO_MAX_FAILURES = 3


def resolve_run(config: TrainingConfig) -> TrainingConfig:
    """A frozen copy of `config` with everything above decided; `config` stays as given. A
    config resolved already is returned as it is."""
    if is_frozen(config):
        return config
    run = copy.deepcopy(config)
    run.make_paths_absolute()
    if run.eval.select_by == AUTO:  # a config built in code, never validated
        run.eval.select_by = validate_selection(run.eval, run.builds_documents())
    layout = apply_layout(run.train)
    if layout is not None:
        log.info(layout)
    resolve_progress_bar(run)
    resolve_max_failures(run)
    return freeze(run)


def resolve_max_failures(config: TrainingConfig) -> None:
    """train.max_failures null → AUTO_MAX_FAILURES where nodes can be lost (joins_cluster, or
    a remote output.storage_path), else 0. A count given stays."""
    if config.train.max_failures is not None:
        return
    remote = config.output.storage_path is not None and is_remote(config.output.storage_path)
    cloud = remote or joins_cluster(config.ray.address)
    config.train.max_failures = AUTO_MAX_FAILURES if cloud else 0


def joins_cluster(address: str | None) -> bool:
    """Does this job run on a Ray it joined (ray.address, or RAY_ADDRESS as `ray job submit`
    sets it) rather than one it started? Asked in a Ray worker process (a Tune trial resolves
    its own config), the answer is no: there RAY_ADDRESS is what the job handed its workers,
    also for a Ray it started itself; only remote storage counts."""
    import ray  # startup

    if ray.is_initialized() and ray.get_runtime_context().worker.mode != ray.SCRIPT_MODE:
        return False
    return bool(address or os.environ.get("RAY_ADDRESS"))


def failures_line(config: TrainingConfig) -> str:
    """The restart budget as the run starts with it (printed by run_training)."""
    count = config.train.max_failures
    budget = "unlimited" if count == -1 else str(count)
    if count == 0:
        return (
            "train.max_failures=0: a lost worker or node ends the run (set a count, or leave "
            "it null on a cluster or object storage, to restart from the last checkpoint)"
        )
    return (
        f"train.max_failures={budget}: a lost worker or node restarts the worker group from "
        "the last checkpoint, up to that many times"
    )
