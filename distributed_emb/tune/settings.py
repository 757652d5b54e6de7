"""The search job's configuration: a TrainingConfig (the base every trial starts from) plus
`search:` (the space, see tune/search_space.py) and `tune:` (how the search runs).

One YAML holds all three, so `key=value` overrides reach everything:
`train.max_steps=30 tune.num_samples=8 tune.scheduler=fifo`.
"""

from __future__ import annotations

import copy
import math
import typing
from dataclasses import dataclass, field
from typing import Any

from distributed_emb.config import (
    ConfigError,
    TrainingConfig,
    require_range,
    require_seed,
    training_sections,
)
from distributed_emb.tune.search_space import DEFAULT_SEARCH_SPACE, Distribution, parse_search_space


def _require(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{key}: {message}")


@dataclass
class TuneSettings:
    num_samples: int = 4  # trials (times the grid size when a key is of type grid)
    # random: Tune's BasicVariantGenerator (random sampling; grid keys are crossed).
    # optuna: OptunaSearch (TPE), which learns from finished trials; no grid keys.
    searcher: typing.Literal["random", "optuna"] = "random"
    # asha: stop trials whose STS-B dev is in the bottom (1 − 1/reduction_factor) at a rung.
    # fifo: run every trial to the end.
    scheduler: typing.Literal["asha", "fifo"] = "asha"
    # ASHA's clock: optimizer steps (every trial is judged after the same number of steps),
    # or training_iteration (the number of reports: 1 is the step-0 evaluation).
    time_attr: typing.Literal["step", "training_iteration"] = "step"
    grace_period: int | None = None  # None: the first evaluation after step 0
    reduction_factor: float = 2.0
    max_t: int | None = None  # None: train.max_steps (or its number of reports)
    max_concurrent_trials: int | None = None  # None: as many as the cluster's resources fit
    # Tune-level retries of a trial whose driver or Train run failed; a retried trial resumes
    # from its last Train checkpoint. Exhausted retries mark the trial errored; the search
    # goes on with the others either way.
    max_failures: int = 0
    seed: int | None = 0  # searcher seed (None: not reproducible)
    export_best: bool = True  # export the best trial's best checkpoint as a model
    plots: bool = True
    # Continue the search already in output.dir, with the config saved there (--resume).
    resume: bool = False


@dataclass
class SearchJobConfig(TrainingConfig):
    search: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(DEFAULT_SEARCH_SPACE))
    tune: TuneSettings = field(default_factory=TuneSettings)

    def base(self) -> TrainingConfig:
        """The TrainingConfig part: what every trial starts from before its sampled values."""
        return copy.deepcopy(training_sections(self))

    def space(self) -> dict[str, Distribution]:
        return parse_search_space(self.search, self.base())

    def validate(self) -> None:
        super().validate()
        t = self.tune
        require_range(t.num_samples, "tune.num_samples", 1)
        require_range(t.grace_period, "tune.grace_period", 1, allow_none=True)
        require_range(t.reduction_factor, "tune.reduction_factor", 1, low_open=True)
        require_range(t.max_t, "tune.max_t", 1, allow_none=True)
        require_range(t.max_concurrent_trials, "tune.max_concurrent_trials", 1, allow_none=True)
        require_range(t.max_failures, "tune.max_failures", -1, why="-1: unlimited")
        require_seed(t.seed, "tune.seed", allow_none=True)
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
