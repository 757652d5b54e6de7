"""The one step that turns a validated training config into what a run uses, on the driver.

After `resolve_run` nothing changes the run's settings: the returned config is frozen
(settings.freeze), the Ray Train workers get it as a dict, and every later function reads it.
What the step decides:
- paths made absolute (workers run in other directories: TrainingConfig.make_paths_absolute);
- `train.layout=auto` made a concrete layout (train/layout.py), with Ray up so that it sees the
  cluster's nodes: the resource plan, the run's identity and its checkpoints all see the
  workers that will run;
- `logging.progress_bar=auto` decided by the driver's console (the workers' is a file).

Two things are decided later, where the facts are: each rank's rows of a global batch depend
on the size of the group that runs it (an elastic group's size changes; data/global_batches.py
split_rows), and `train.precision=auto` is timed on rank 0's device (train/precision.py).
"""

from __future__ import annotations

import copy
import logging

from distributed_emb.config import TrainingConfig
from distributed_emb.evaluation.eval_config import validate_selection
from distributed_emb.selection import AUTO
from distributed_emb.settings import freeze, is_frozen
from distributed_emb.train.layout import apply_layout
from distributed_emb.train.progress import resolve_progress_bar

log = logging.getLogger(__name__)


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
    return freeze(run)
