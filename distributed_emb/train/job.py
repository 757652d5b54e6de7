"""The training job's own steps (jobs/train_informin.py, jobs/finetune_mcr2.py run them through
cli.run_job): its checks before Ray starts, its resource plan, the run and its summary."""

from __future__ import annotations

import copy
from pathlib import Path

from distributed_emb.checks import require
from distributed_emb.config import TrainingConfig
from distributed_emb.data.beir_layout import list_splits, read_splits
from distributed_emb.data.corpus import check_small_corpus
from distributed_emb.model.compression_head import HEAD_INFO_FILE, read_head_info
from distributed_emb.model.model_card import position_limit
from distributed_emb.paths import default_model_path
from distributed_emb.resource_plan import cluster_from_ray, training_plan
from distributed_emb.selection import STSB_DEV, describe, is_given_model, scored_splits
from distributed_emb.storage_paths import require_writable
from distributed_emb.train.run_identity import prepare_run


def check(config: TrainingConfig) -> None:
    """Before Ray starts: the storage the run writes to, an earlier run under the same name
    (run_training checks again and, for --overwrite, deletes), and the corpus (listed; a small
    local one counted)."""
    check_storage(config)
    check_model_lengths(config)
    check_compression_head(config)
    check_retrieval_data(config)
    # The run's identity is of the absolute paths (resolved again, with the layout, when it runs).
    prepare_run(with_absolute_paths(config), dry_run=True)
    train = config.train
    check_small_corpus(
        config.data,
        train.global_batch * train.gradient_accumulation_steps,
        f"train.num_workers {train.max_workers} × train.batch_size {train.batch_size} × "
        f"train.gradient_accumulation_steps {train.gradient_accumulation_steps}",
    )


def with_absolute_paths(config: TrainingConfig) -> TrainingConfig:
    """A copy of `config` whose paths are as the run will resolve them (train/resolved_run.py)."""
    absolute = copy.deepcopy(config)
    absolute.make_paths_absolute()
    return absolute


def check_storage(config: TrainingConfig) -> None:
    require_writable(config.output.dir, "output.dir")
    require_writable(config.output.storage_path, "output.storage_path")
    require_writable(config.data.token_cache_dir, "data.token_cache_dir")


def check_retrieval_data(config: TrainingConfig) -> None:
    """The eval.retrieval_dir splits every evaluation will score, read and checked here: a
    malformed line (BeirDataError, naming file:line) fails before Ray starts, not in every
    Train worker minutes in. Object storage is read where it is used."""
    directory = config.eval.retrieval_dir
    if directory is None or "://" in directory:
        return
    read_splits(directory, scored_splits(list_splits(directory), config.eval.select_by))


def check_model_lengths(config: TrainingConfig) -> None:
    """model.max_seq_length and export.max_seq_length within what the model's position
    embeddings take (its config.json): past them a Train worker fails on an index, minutes in.
    A hub name or a model on object storage is checked where it is loaded."""
    path = config.model.path or default_model_path()
    if "://" in path or not Path(path).is_dir():
        return
    limit = position_limit(path)
    if limit is None:
        return
    for key, value in (
        ("model.max_seq_length", config.model.max_seq_length),
        ("export.max_seq_length", config.export.max_seq_length),
    ):
        require(
            value is None or value <= limit,
            key,
            f"must be <= {limit} (the position embeddings of {path}), got {value}",
        )


def check_compression_head(config: TrainingConfig) -> None:
    """model.compression_head: a head directory of jobs/train_mcr2.py whose encoder was read
    with this run's model.pooler."""
    m = config.model
    if m.compression_head is None:
        return
    require(
        Path(m.compression_head).is_dir(),
        "model.compression_head",
        f"{m.compression_head} is not a directory (give a models/mcr2-<dim> directory "
        "written by jobs/train_mcr2.py)",
    )
    info_file = Path(m.compression_head) / HEAD_INFO_FILE
    require(
        info_file.is_file(),
        "model.compression_head",
        f"{info_file} is missing (a models/mcr2-<dim> directory of jobs/train_mcr2.py holds it)",
    )
    head_pooler = read_head_info(m.compression_head).get("pooler")
    require(
        head_pooler == m.pooler,
        "model.pooler",
        (
            f"is {m.pooler}, but the head in {m.compression_head} read {head_pooler} pooling "
            f"(model.pooler of jobs/train_mcr2.py): set model.pooler={head_pooler}"
        )
        if head_pooler
        else f"the head in {m.compression_head} read the encoder as saved (model.pooler null "
        "in jobs/train_mcr2.py); retrain it with model.pooler set",
    )


def plan(config: TrainingConfig) -> int:
    """`--plan`: the resource plan on the cluster the run would use; 0 if it fits (now or once
    the autoscaler adds nodes), 3 if it never can."""
    plan = training_plan(config, cluster_from_ray())
    print(plan.table())
    return 3 if plan.problem else 0


def run(config: TrainingConfig) -> int:
    from distributed_emb.train.trainer import run_training  # startup: torch, transformers

    result = run_training(config)
    print(summarise_run(result.metrics))
    return 0


def summarise_run(metrics: dict) -> str:
    def fmt(value, spec=".2f"):
        return "n/a" if value is None else format(value, spec)

    corpus = metrics.get("corpus") or {}
    select_by = metrics.get("select_by", STSB_DEV)
    chosen = []
    if select_by != STSB_DEV:  # the score that chose, then STS-B dev at the same points
        chosen = [
            f"chosen on:        {describe(select_by)} {fmt(metrics.get('dev_before'))} → "
            f"{fmt(metrics.get('dev_after'))} (best {fmt(metrics.get('dev_best'))} at step "
            f"{metrics.get('best_step')}, exported)"
        ]
    exported = "best" if select_by == STSB_DEV else "exported"
    # The start won: the one line that says the model handed back is the one given.
    given = [metrics["exported"]] if is_given_model(metrics.get("exported")) else []
    return "\n".join(
        [
            f"model:            {metrics.get('model_dir')}",
            *chosen,
            f"STS-B dev:        {fmt(metrics.get('stsb_dev_before'))} → "
            f"{fmt(metrics.get('stsb_dev_after'))} ({exported} "
            f"{fmt(metrics.get('stsb_dev_best'))} at step {metrics.get('best_step')})",
            f"STS-B test:       {fmt(metrics.get('stsb_test'))} (exported model)",
            f"steps:            {metrics.get('steps')} × global batch "
            f"{metrics.get('global_batch')}",
            f"sentences/s:      {fmt(metrics.get('sentences_per_s'), '.1f')}",
            f"corpus:           kept {corpus.get('kept')}, dropped {corpus.get('dropped')}",
            f"wall time:        {fmt(metrics.get('wall_time_s'), '.0f')} s",
            *given,
        ]
    )


# What a training job declares besides its description and default YAML (jobs/train_informin.py
# and jobs/finetune_mcr2.py: `Job(..., **TRAINING_STEPS)`).
TRAINING_STEPS = {
    "config_class": TrainingConfig,
    "check": check,
    "plan": plan,
    "run": run,
    "earlier_run_flags": True,
}
