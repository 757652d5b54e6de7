"""The search: one Tune trial = one Ray Train run of the training job's own TorchTrainer.

Ray Train V2 pattern (docs: "Hyperparameter Tuning with Ray Tune"): `Tuner(run_trial)`, where
`run_trial` is a small driver function that turns the trial's sampled values into a
TrainingConfig, builds the TorchTrainer with `build_trainer` (the same one
jobs/train_informin.py runs, so a search trains exactly what training trains) and forwards
every evaluation to Tune through `TuneReportCallback`. Tune (ASHA, the searcher) compares trials
on the selection score (`select_score`: eval.select_by's STS-B dev or retrieval nDCG@10).

Resources: the trial driver only waits on its TorchTrainer, so it reserves no CPU, only
DRIVER_MEMORY (Tune needs a non-empty bundle for it); the Train workers (num_workers ×
cpus_per_worker CPUs, + GPUs) are what limits concurrency. A driver holding a whole CPU
deadlocks small machines (two drivers take both CPUs and neither trial's workers can start),
and one holding a sliver of a CPU deadlocks clusters: beside a 2-CPU worker on a 3-CPU node it
leaves 0.99 CPU, and every Ray Data task asks for 1 (docs/TUNE.md).

The corpus is read and cleaned once, on the search driver, materialised in the object store
and handed to every trial: no trial re-reads it, and no trial needs CPUs for read tasks
while other trials' workers hold every CPU.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray import tune as ray_tune
from ray.tune.integration.ray_train import TuneReportCallback
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
from ray.tune.search import BasicVariantGenerator

from distributed_emb.checks import ConfigError
from distributed_emb.config import TrainingConfig, from_dict, to_dict
from distributed_emb.data.token_cache import searched_key_settings
from distributed_emb.data.training_stream import TrainingStream, training_stream
from distributed_emb.resource_plan import (
    ClusterShape,
    PlanError,
    ResourcePlan,
    cluster_from_ray,
    compute_plan,
)
from distributed_emb.selection import SELECT_METRIC
from distributed_emb.storage import join, run_uri
from distributed_emb.tracking import LOGS_DIR
from distributed_emb.train.driver import build_trainer, train_on_documents, worker_resources
from distributed_emb.train.worker import plan_steps
from distributed_emb.tune.janitor import PlacementGroupJanitor
from distributed_emb.tune.search_config import SearchJobConfig, asha_budget
from distributed_emb.tune.search_space import (
    Distribution,
    apply_params,
    grid_size,
    param_space,
)
from distributed_emb.tune.trial_progress import TrialProgress
from distributed_emb.watchdog import no_silent_stall

log = logging.getLogger(__name__)

# Each trial's driver: a Python process that waits on its Train controller. Memory, not CPU:
# any CPU share, however small, leaves its node short of the whole CPU a Ray Data task needs.
DRIVER_MEMORY = 256 * 1024**2
DRIVER_RESOURCES = {"cpu": 0, "memory": DRIVER_MEMORY}
TRIALS_DIR = "trials"  # <output>/trials/<run name>/: a trial's run.log and metric sinks


@dataclass(frozen=True)
class SearchPaths:
    output: Path  # local directory: tables, plots, best config and model
    storage: str  # Tune and Train storage root: the output dir, or output.storage_path (s3://…)
    name: str  # Tune experiment name; Train runs are "<name>-<trial id>"
    train_storage: str  # where the trials' Train runs live (build_trainer's storage choice)

    @property
    def experiment(self) -> str:
        return f"{self.storage.rstrip('/')}/{self.name}"


def search_paths(config: TrainingConfig) -> SearchPaths:
    output = Path(config.output.dir).resolve()
    return SearchPaths(
        output=output,
        storage=config.output.storage_path or str(output),
        name=config.output.run_name or "search",
        # build_trainer: output.storage_path, else <output.dir>/ray_results (trials get
        # output.dir = this output directory, see make_trainable)
        train_storage=config.output.storage_path or str(output / "ray_results"),
    )


# ---------------------------------------------------------------------------------------------
# Resources
# ---------------------------------------------------------------------------------------------


def trial_resources(config: TrainingConfig) -> dict[str, float]:
    """What one trial's Train workers hold: {"CPU": n, "GPU": n}."""
    t = config.train
    # An elastic trial may grow to its largest group: plan for that.
    return {
        "CPU": t.max_workers * t.cpus_per_worker,
        "GPU": t.max_workers if t.use_gpu else 0,
    }


def _candidate_configs(base: TrainingConfig, space: dict[str, Distribution]):
    """The base config and every config one searched value away from it (each value of a
    list, each bound of a range): what resource and batch checks need to see."""
    yield None, None, base
    for key, distribution in space.items():
        for value in distribution.candidates():
            yield key, value, apply_params(base, {key: value}, where=f"search.{key}")


def resources_per_trial(base: TrainingConfig, space: dict[str, Distribution]) -> dict[str, float]:
    """The most any trial can need (num_workers or use_gpu may themselves be searched)."""
    needs = [trial_resources(config) for _, _, config in _candidate_configs(base, space)]
    return {name: max(need[name] for need in needs) for name in ("CPU", "GPU")}


def worker_bundles(
    base: TrainingConfig, space: dict[str, Distribution], worker_cpus: float | None = None
) -> list[dict[str, float]]:
    """Every shape one Train worker's resources can take in this search (`worker_cpus`: the
    plan's lowered reservation, see trial_worker_cpus)."""
    shapes = []
    for _, _, config in _candidate_configs(base, space):
        shape = worker_resources(config, trial_worker_cpus(config, worker_cpus))
        if shape not in shapes:
            shapes.append(shape)
    return shapes


def derive_max_concurrent_trials(
    cluster: dict[str, float],
    per_trial: dict[str, float],
    data_cpus: float = 0.0,
    total_trials: int | None = None,
) -> int:
    """How many trials fit side by side: each takes its workers' CPUs (and GPUs), after Ray
    Data's share (`train.data_cpus`, which feeds every trial's workers); drivers take no CPU.
    At least 1 (an autoscaling cluster grows on demand; on a fixed one the search plan lowers
    the workers' reservations or fails naming the fix), at most `total_trials`: a plan for
    more trials than the search has lowered every worker's reservation (2 → 1.5 CPU for a
    2-trial search on 9 CPUs) to fit trials that never come."""
    room = cluster.get("CPU", 0) - data_cpus
    fits = [math.floor(room / per_trial["CPU"] + 1e-9)]
    if per_trial["GPU"] > 0:
        fits.append(math.floor(cluster.get("GPU", 0) / per_trial["GPU"] + 1e-9))
    if total_trials is not None:
        fits.append(total_trials)
    return max(1, min(fits))


def search_plan(
    base: TrainingConfig, space: dict[str, Distribution], cluster: ClusterShape, concurrent: int
) -> ResourcePlan:
    """One resource plan for `concurrent` trials side by side (docs/OPERATIONS.md, "Sizing a
    cluster"): their Train workers at the largest searched shape and Ray Data's share (the
    drivers take no CPU), which runs each trial's feeding stage (the corpus itself is read once,
    before any trial). Where only CPUs are short, the plan lowers each worker's reservation
    as it does for one training run, and every trial is built with that reservation."""
    configs = [config for _, _, config in _candidate_configs(base, space)]
    return compute_plan(
        cluster,
        concurrent * max(c.train.max_workers for c in configs),
        max(c.train.cpus_per_worker for c in configs),
        any(c.train.use_gpu for c in configs),
        base.train.data_cpus,
        base.train.lower_cpus_to_fit,
    )


def trial_worker_cpus(config: TrainingConfig, planned: float | None) -> float | None:
    """A trial's worker reservation: the plan's lowered value, never above what the trial
    itself asks (train.cpus_per_worker may be searched)."""
    return None if planned is None else min(planned, config.train.cpus_per_worker)


def check_batches_fit(base: TrainingConfig, space: dict[str, Distribution], num_rows: int) -> None:
    """Every searched batch size must give at least one step on this corpus: fail now, with
    the key, instead of as an errored trial."""
    for key, value, config in _candidate_configs(base, space):
        try:
            plan_steps(config.train, num_rows)
        except ValueError as error:
            where = f"search.{key}={value}" if key else "train.batch_size"
            raise ConfigError(f"{where}: {error}") from None


# ---------------------------------------------------------------------------------------------
# The trial
# ---------------------------------------------------------------------------------------------


def run_trial(
    params: dict[str, Any],
    *,
    base: dict,
    stream: TrainingStream | None,
    name: str,
    worker_cpus: float | None = None,
) -> None:
    """One Tune trial: the base config with this trial's values, trained by the job's own
    TorchTrainer; every evaluation reaches Tune through TuneReportCallback. `stream` None: the
    trial's own token shards (the search varies what the ids depend on)."""
    config = apply_params(from_dict(TrainingConfig, base), params)
    # A stable name (no timestamp): a retried or resumed trial finds its own Train run in
    # storage and continues from its last checkpoint.
    run_name = f"{name}-{ray_tune.get_context().get_trial_id()}"
    # Trials run side by side: each writes its run.log, train_log.jsonl and tensorboard/ in
    # trials/<run name>/ of the search's output; its Train run stays in the search's storage
    # (<output>/ray_results unless output.storage_path), where tune/results.py reads it.
    # With output.storage_path, rank 0 also keeps them at <storage>/<run name>/logs/ (on a
    # cluster its node may be gone by the time the search ends).
    shared = config.output.storage_path
    stored_logs = join(run_uri(shared, run_name), LOGS_DIR) if shared else None
    config.output.storage_path = shared or str(Path(config.output.dir) / "ray_results")
    config.output.dir = str(Path(config.output.dir) / TRIALS_DIR / run_name)
    if stream is None:
        stream = training_stream(config.data, config.stream_settings())
    trainer = build_trainer(
        config,
        stream,
        run_name,
        callbacks=[TuneReportCallback()],
        stored_logs=stored_logs,
        worker_cpus=trial_worker_cpus(config, worker_cpus),
    )
    trainer.fit()  # raises when the run fails: Tune marks the trial errored (or retries it)


def trial_dirname(trial) -> str:
    """Short trial directories (Tune's default packs every parameter into the name)."""
    return f"trial_{trial.trial_id}"


# ---------------------------------------------------------------------------------------------
# Tuner
# ---------------------------------------------------------------------------------------------


def build_scheduler(config: SearchJobConfig):
    if config.tune.scheduler == "fifo":
        return FIFOScheduler()
    grace, max_t = asha_budget(config)
    return ASHAScheduler(
        time_attr=config.tune.time_attr,
        max_t=max_t,
        grace_period=grace,
        reduction_factor=config.tune.reduction_factor,
    )


def build_searcher(config: SearchJobConfig, max_concurrent: int):
    """(search_alg, max_concurrent_trials for TuneConfig). Tune ignores TuneConfig's limit
    for a BasicVariantGenerator instance (it only wraps Searchers), so that one gets the limit
    itself."""
    if config.tune.searcher == "optuna":
        from ray.tune.search.optuna import OptunaSearch  # optional

        return OptunaSearch(seed=config.tune.seed), max_concurrent
    return BasicVariantGenerator(random_state=config.tune.seed, max_concurrent=max_concurrent), None


def make_trainable(
    base: TrainingConfig, stream: TrainingStream | None, paths: SearchPaths, worker_cpus=None
):
    """run_trial with the base config, the shared stream (None: each trial's own) and the
    plan's worker reservation bound, its driver on DRIVER_RESOURCES."""
    trial_base = to_dict(base)
    trial_base["output"]["dir"] = str(paths.output)  # Train storage: <output>/ray_results
    trainable = ray_tune.with_parameters(
        run_trial,
        base=trial_base,
        stream=stream,
        name=paths.name,
        worker_cpus=worker_cpus,
    )
    return ray_tune.with_resources(trainable, DRIVER_RESOURCES)


def build_tune_config(config: SearchJobConfig, max_concurrent: int) -> ray_tune.TuneConfig:
    """What the search compares trials on: the selection score every evaluation reports
    (eval.select_by's STS-B dev or retrieval nDCG@10), higher is better, for the scheduler
    and the searcher alike."""
    searcher, tune_limit = build_searcher(config, max_concurrent)
    return ray_tune.TuneConfig(
        metric=SELECT_METRIC,
        mode="max",
        num_samples=config.tune.num_samples,
        scheduler=build_scheduler(config),
        search_alg=searcher,
        max_concurrent_trials=tune_limit,
        trial_dirname_creator=trial_dirname,
    )


def new_tuner(config: SearchJobConfig, trainable, max_concurrent: int, paths: SearchPaths):
    return ray_tune.Tuner(
        trainable,
        param_space=param_space(config.space()),
        tune_config=build_tune_config(config, max_concurrent),
        run_config=ray_tune.RunConfig(
            name=paths.name,
            storage_path=paths.storage,
            failure_config=ray_tune.FailureConfig(max_failures=config.tune.max_failures),
            callbacks=[TrialProgress(config.tune.num_samples * grid_size(config.space()))],
        ),
    )


def can_resume(paths: SearchPaths) -> bool:
    return ray_tune.Tuner.can_restore(paths.experiment)


def fit_watched(tuner, stall_timeout_s: float | None) -> None:
    """tuner.fit() under the stall watchdog: trials run in Tune's actors, where a watchdog
    cannot interrupt anything, so the search driver watches for all of them. Tune starts no
    more trials than fit side by side, so a placement group, task or actor pending past
    train.stall_timeout_s is a stall, not a queued trial. The watchdog's interrupt is a
    SIGINT, which Tune answers by saving the search and returning."""
    hint = (
        "fix: see the resource plan above (train.num_workers, train.cpus_per_worker, "
        "train.data_cpus, tune.max_concurrent_trials) and docs/OPERATIONS.md, 'Sizing a cluster'"
    )
    with no_silent_stall(stall_timeout_s, hint=hint):
        tuner.fit()


@dataclass
class SearchRun:
    experiment_path: str
    max_concurrent_trials: int
    per_trial: dict[str, float]
    cluster: dict[str, float]
    corpus: dict
    corpus_load_s: float
    wall_s: float
    interrupted: bool
    freed_placement_groups: list[str]  # leaked Train worker groups the janitor removed


def run_search(config: SearchJobConfig, resume: bool = False) -> SearchRun:
    """Load the corpus once, then run (or resume) the search to the end. Ray must be up."""
    started = time.time()
    paths = search_paths(config)
    base, space = config.base(), config.space()
    # documents.paths: every trial trains on the same prepared sentences and is chosen on the
    # same held-out documents (train/document_corpus.py).
    base = train_on_documents(base)

    cluster = {k: float(v) for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}
    per_trial = resources_per_trial(base, space)
    total_trials = config.tune.num_samples * grid_size(space)
    derived = derive_max_concurrent_trials(cluster, per_trial, base.train.data_cpus, total_trials)
    max_concurrent = min(config.tune.max_concurrent_trials or derived, total_trials)
    if max_concurrent > derived:
        log.warning(
            "tune.max_concurrent_trials=%d but the cluster (%s) fits %d trials of %s: the "
            "others wait for workers (fine on an autoscaling cluster)",
            max_concurrent,
            cluster,
            derived,
            per_trial,
        )
    # Fit or fail before the corpus is read: on a fixed cluster the plan is for the trials
    # that can run side by side (the others queue in Tune, not in Ray).
    shape = cluster_from_ray()
    plan = search_plan(
        base, space, shape, max_concurrent if shape.autoscaling else min(max_concurrent, derived)
    )
    log.info("%s", plan.table())
    if plan.problem:
        raise PlanError(f"the search does not fit the cluster: {plan.problem}")
    worker_cpus = plan.worker_cpu if plan.lowered else None
    log.info(
        "trials need %s each (+%d MiB for the driver%s); cluster %s → %d at a time",
        per_trial,
        DRIVER_MEMORY // 1024**2,
        f"; workers reserve {worker_cpus:g} CPU each" if worker_cpus else "",
        cluster,
        max_concurrent,
    )

    # Tokenised once into indexed shards that every trial's ranks read (data/token_cache.py),
    # unless the search varies a setting the token ids depend on: then each trial builds (or
    # reuses) the shards of its own settings, and the base's give the count and drop report.
    stream = training_stream(base.data, base.stream_settings())
    varied = searched_key_settings(space)
    if varied:
        log.info("each trial reads its own token shards: the search varies %s", ", ".join(varied))
    num_rows, report = stream.rows, stream.report
    corpus_load_s = time.time() - started
    log.info("%s (read once for all trials, %.1f s)", report.summary(), corpus_load_s)
    check_batches_fit(base, space, num_rows)
    log.info("searching %s", ", ".join(f"{k} {d.describe()}" for k, d in space.items()))

    trainable = make_trainable(base, None if varied else stream, paths, worker_cpus)
    if resume:
        tuner = ray_tune.Tuner.restore(
            paths.experiment, trainable=trainable, resume_unfinished=True, resume_errored=False
        )
    else:
        tuner = new_tuner(config, trainable, max_concurrent, paths)
    # Trial failures do not raise here (they are in the results); an interrupt (SIGINT)
    # returns early with the state saved. Results are read back from storage, in
    # tune/results.py, so a resumed search reads the same as an uninterrupted one.
    janitor = PlacementGroupJanitor(worker_bundles(base, space, worker_cpus))
    janitor.start()
    try:
        fit_watched(tuner, base.train.stall_timeout_s)
    finally:
        janitor.stop()
    analysis = ray_tune.ExperimentAnalysis(paths.experiment)
    unfinished = [t for t in analysis.trials if t.status not in ("TERMINATED", "ERROR")]
    return SearchRun(
        experiment_path=paths.experiment,
        max_concurrent_trials=max_concurrent,
        per_trial=per_trial,
        cluster=cluster,
        corpus=report.as_dict(),
        corpus_load_s=round(corpus_load_s, 1),
        wall_s=round(time.time() - started, 1),
        interrupted=bool(unfinished),
        freed_placement_groups=janitor.removed,
    )
