"""The search job's configuration: a TrainingConfig (the base every trial starts from) plus
`search:` (the space, see tune/search_space.py) and `tune:` (how the search runs).

One YAML holds all three, so `key=value` overrides reach everything:
`train.max_steps=30 tune.num_samples=8 tune.scheduler=fifo`.
"""

from __future__ import annotations

import copy
import math
from dataclasses import field
from typing import Annotated, Any, Literal

from pydantic import Field

from distributed_emb.checks import ConfigError
from distributed_emb.config import TrainingConfig, training_sections
from distributed_emb.settings import Seed, section
from distributed_emb.tune.search_space import DEFAULT_SEARCH_SPACE, Distribution, parse_search_space


def _require(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{key}: {message}")


@section
class TuneSettings:
    num_samples: Annotated[
        int,
        Field(ge=1, description="trials (times the grid size when a key is of type grid)"),
    ] = 4
    searcher: Annotated[
        Literal["random", "optuna"],
        Field(
            description="random: Tune's BasicVariantGenerator (random sampling; grid keys are "
            "crossed); optuna: OptunaSearch (TPE), which learns from finished trials; no grid "
            "keys"
        ),
    ] = "random"
    scheduler: Annotated[
        Literal["asha", "fifo"],
        Field(
            description="asha: stop trials whose selection score (eval.select_by) is in the "
            "bottom (1 - 1/reduction_factor) at a rung; fifo: run every trial to the end"
        ),
    ] = "asha"
    time_attr: Annotated[
        Literal["step", "training_iteration"],
        Field(
            description="ASHA's clock: optimizer steps (every trial is judged after the same "
            "number of steps), or training_iteration (the number of reports: 1 is the step-0 "
            "evaluation)"
        ),
    ] = "step"
    grace_period: Annotated[
        int | None,
        Field(
            ge=1,
            description="ASHA's first rung, in tune.time_attr units; null: the first "
            "evaluation after step 0",
        ),
    ] = None
    reduction_factor: Annotated[
        float,
        Field(gt=1, description="ASHA keeps 1/reduction_factor of the trials at each rung"),
    ] = 2.0
    max_t: Annotated[
        int | None,
        Field(
            ge=1,
            description="ASHA's last rung, in tune.time_attr units; null: train.max_steps (or "
            "its number of reports)",
        ),
    ] = None
    max_concurrent_trials: Annotated[
        int | None,
        Field(
            ge=1,
            description="trials run at once; null: as many as the cluster's resources fit",
        ),
    ] = None
    # Exhausted retries mark the trial errored; the search goes on with the others either way.
    max_failures: Annotated[
        int,
        Field(
            ge=-1,
            description="Tune-level retries of a trial whose driver or Train run failed, each "
            "resuming from its last Train checkpoint (-1: unlimited)",
        ),
    ] = 0
    seed: Annotated[
        Seed | None, Field(description="the searcher's seed; null: not reproducible")
    ] = 0
    export_best: Annotated[
        bool,
        Field(description="export the best trial's best checkpoint as a model (best_model/)"),
    ] = True
    plots: Annotated[
        bool,
        Field(description="plots of STS-B dev against each searched key, and learning curves"),
    ] = True
    resume: Annotated[
        bool,
        Field(
            description="continue the search already in output.dir, with the config saved "
            "there (--resume)"
        ),
    ] = False


@section
class SearchJobConfig(TrainingConfig):
    # Checked by parse_search_space (validate()): every key a searchable setting, every
    # candidate value one its declaration takes.
    search: Annotated[
        dict[str, Any],
        Field(
            description="the search space: dotted config key → {type: loguniform|uniform, "
            "low, high} or {type: choice|grid, values: [...]}; null for a key: not searched "
            "(docs/TUNE.md); given, it replaces the built-in space as a whole"
        ),
    ] = field(default_factory=lambda: copy.deepcopy(DEFAULT_SEARCH_SPACE))
    tune: TuneSettings = field(default_factory=TuneSettings)

    def base(self) -> TrainingConfig:
        """The TrainingConfig part: what every trial starts from before its sampled values."""
        return copy.deepcopy(training_sections(self))

    def space(self) -> dict[str, Distribution]:
        return parse_search_space(self.search, self.base())

    def validate(self) -> None:
        """The checks that read more than one setting (the ranges are declared)."""
        super().validate()
        t = self.tune
        # Trials are laid out together by the search's resource plan, with the workers and
        # batch each trial is given (or searches): a per-trial automatic layout would change
        # the batch size the searcher thinks it chose.
        _require(
            self.train.layout == "as_set",
            "train.layout",
            "auto is for a single training run; a search lays its trials out as set (set "
            "train.num_workers and train.batch_size, or search them)",
        )
        space = self.space()
        if t.searcher == "optuna":
            grid = [key for key, d in space.items() if d.kind == "grid"]
            _require(
                not grid,
                f"search.{grid[0]}" if grid else "search",
                "type grid needs tune.searcher=random (Optuna samples, it does not enumerate)",
            )
        if t.scheduler == "asha":
            grace, max_t = asha_budget(self)
            _require(grace >= 1, "tune.grace_period", f"must be >= 1, got {grace}")
            _require(
                max_t >= grace,
                "tune.max_t",
                f"({max_t}) must be >= tune.grace_period ({grace})",
            )


def asha_budget(config: SearchJobConfig) -> tuple[int, int]:
    """(grace_period, max_t) in units of tune.time_attr, filling in the defaults."""
    t, steps, every = config.tune, config.train.max_steps, config.eval.eval_steps
    if t.max_t is None and steps is None:
        raise ConfigError(
            "tune.max_t: set it, or train.max_steps, for ASHA (its last rung needs a budget)"
        )
    if t.time_attr == "step":
        max_t = t.max_t or steps
        return t.grace_period or min(every, max_t), max_t
    # Reports: one at step 0, then one per evaluation (and one at the last step).
    max_t = t.max_t or 1 + math.ceil(steps / every)
    return t.grace_period or min(2, max_t), max_t
