"""The driver side of a training run, and the training job's own steps.

jobs/train_informin.py and jobs/finetune_mcr2.py run `TRAINING_STEPS` through cli.run_job:
the checks before Ray starts, the resource plan (`--plan`), the run and its summary.
`run_training` — what those jobs, the InfoCSE rounds and the Tune driver all call, so there is
one copy of the training wiring — resolves the settings once (train/resolved_run.py), checks an
earlier run and the stream it trained on, hands each Ray Train worker train/worker.py's loop,
then exports the best checkpoint and writes metrics.json.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import transformers
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from transformers import AutoTokenizer

from distributed_emb.atomic_files import write_text_atomic
from distributed_emb.checks import require
from distributed_emb.config import TrainingConfig, to_dict
from distributed_emb.data.beir_layout import list_splits, read_splits
from distributed_emb.data.corpus import check_small_corpus
from distributed_emb.data.documents import check_small_documents
from distributed_emb.data.epoch_plan import batch_plan
from distributed_emb.data.training_stream import TrainingStream, training_stream
from distributed_emb.evaluation.senteval_data import SentEvalDataError
from distributed_emb.evaluation.sts import stsb_score
from distributed_emb.evaluation.yardsticks import (
    compare_with_given,
    warning_lines,
    yardstick_lines,
)
from distributed_emb.model.compression_head import HEAD_INFO_FILE, read_head_info
from distributed_emb.model.embedder import Embedder
from distributed_emb.model.export import export_sentence_transformer
from distributed_emb.model.model_card import export_max_seq_length, position_limit
from distributed_emb.model.sentence_transformer import (
    ends_with_normalize,
    is_sentence_transformer_dir,
)
from distributed_emb.paths import default_model_path
from distributed_emb.plots import write_run_plots
from distributed_emb.resource_plan import check_training_plan, cluster_from_ray, training_plan
from distributed_emb.selection import (
    DEV_METRIC,
    SELECT_BY,
    SELECT_METRIC,
    STSB_DEV,
    best_row,
    describe,
    exported_evaluation,
    is_given_model,
    scored_splits,
)
from distributed_emb.storage import copy_to_storage, join, run_uri
from distributed_emb.storage_paths import require_writable
from distributed_emb.tracking import LOGS_DIR, TRAIN_LOG, StoredLogs
from distributed_emb.train.checkpointing import STATE_FILE, LoopState, load_encoder_weights
from distributed_emb.train.document_corpus import TEXT_COLUMN, prepare_documents
from distributed_emb.train.resolved_run import failures_line, resolve_run
from distributed_emb.train.run_card import card_info, finalize_export
from distributed_emb.train.run_identity import (
    check_resumed_stream,
    prepare_run,
    resolve_run_name,
)
from distributed_emb.train.teacher import check_teacher
from distributed_emb.train.worker import build_encoder, train_loop_per_worker
from distributed_emb.watchdog import no_silent_stall

log = logging.getLogger(__name__)


def prepare(config: TrainingConfig) -> None:
    """As loaded: paths absolute, so that the checks before Ray and the run's identity see the
    paths the workers will (resolve_run keeps them so, for configs built in code)."""
    config.make_paths_absolute()


def check(config: TrainingConfig) -> None:
    """Before Ray starts: the storage the run writes to, an earlier run under the same name
    (run_training checks again and, for --overwrite, deletes), and the corpus (listed; a small
    local one counted)."""
    check_storage(config)
    check_model_lengths(config)
    check_compression_head(config)
    check_retrieval_data(config)
    prepare_run(config, dry_run=True)
    train = config.train
    if config.documents.paths:  # prepared with Ray (train/document_corpus.py): listed now
        check_small_documents(config.documents)
        return
    check_small_corpus(
        config.data,
        train.global_batch * train.gradient_accumulation_steps,
        f"train.num_workers {train.max_workers} × train.batch_size {train.batch_size} × "
        f"train.gradient_accumulation_steps {train.gradient_accumulation_steps}",
    )


def check_storage(config: TrainingConfig) -> None:
    require_writable(config.output.dir, "output.dir")
    require_writable(config.output.storage_path, "output.storage_path")
    require_writable(config.data.token_cache_dir, "data.token_cache_dir")


def check_retrieval_data(config: TrainingConfig) -> None:
    """The eval.retrieval_dir splits every evaluation will score, read and checked here: a
    malformed line (BeirDataError, naming file:line) fails before Ray starts, not in every
    Train worker minutes in. Object storage is read where it is used."""
    for directory, documents in ((config.eval.retrieval_dir, False),
                                 (config.eval.documents_dir, True)):  # fmt: skip
        if directory is None or "://" in directory:
            continue
        splits = scored_splits(list_splits(directory), config.eval.select_by, documents)
        read_splits(directory, splits)


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
    given += metrics.get("yardstick_warnings") or []
    return "\n".join(
        [
            f"model:            {metrics.get('model_dir')}",
            *chosen,
            f"STS-B dev:        {fmt(metrics.get('stsb_dev_before'))} → "
            f"{fmt(metrics.get('stsb_dev_after'))} ({exported} "
            f"{fmt(metrics.get('stsb_dev_best'))} at step {metrics.get('best_step')})",
            f"STS-B test:       {fmt(metrics.get('stsb_test'))} (exported model)",
            *yardstick_lines(metrics.get("yardsticks") or {}),
            f"steps:            {metrics.get('steps')} × global batch "
            f"{metrics.get('global_batch')}",
            f"sentences/s:      {fmt(metrics.get('sentences_per_s'), '.1f')}",
            f"corpus:           kept {corpus.get('kept')}, dropped {corpus.get('dropped')}",
            f"wall time:        {fmt(metrics.get('wall_time_s'), '.0f')} s",
            *given,
        ]
    )


@dataclass
class TrainingResult:
    model_dir: str | None
    best_checkpoint: str | None
    metrics: dict = field(default_factory=dict)


def build_trainer(
    config: TrainingConfig,
    stream: TrainingStream,
    run_name: str | None = None,
    callbacks: list | None = None,
    worker_cpus: float | None = None,
    stored_logs: str | None = None,
):
    """The TorchTrainer for `config` (also used by the Tune driver, which passes Ray Train
    callbacks such as TuneReportCallback). `stream`: what the run trains on
    (data/training_stream.py; its source, the indexed shards, goes to the workers, each of
    which reads its own rows from it). `worker_cpus`: each
    worker's CPU reservation from the resource plan (resource_plan.py), when it lowered
    `train.cpus_per_worker`. `stored_logs`: the run's `logs/` on its storage path, which rank
    0 keeps up to date (run_training's StoredLogs; None: the local files only)."""
    config = resolve_run(config)  # a Tune trial's, or a bench's, resolved here
    train = config.train
    storage = config.output.storage_path or str(Path(config.output.dir).resolve() / "ray_results")
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={
            "training": to_dict(config),
            "num_rows": stream.rows,
            "source": stream.source,
            "stream": stream.identity(batch_plan(config.data, train.global_batch)),
            "stored_logs": stored_logs,
        },
        scaling_config=ScalingConfig(
            # [min, max]: Ray Train's elastic worker group.
            num_workers=tuple(train.num_workers) if train.elastic else train.num_workers,
            elastic_resize_monitor_interval_s=train.elastic_resize_interval_s,
            use_gpu=train.use_gpu,
            resources_per_worker=worker_resources(config, worker_cpus),
        ),
        run_config=RunConfig(
            name=run_name or resolve_run_name(config),
            storage_path=storage,
            checkpoint_config=CheckpointConfig(
                num_to_keep=config.output.checkpoints_to_keep,
                # eval.select_by's score (selection.py): the kept checkpoints are the
                # best by what the run chooses on.
                checkpoint_score_attribute=SELECT_METRIC,
                checkpoint_score_order="max",
            ),
            failure_config=FailureConfig(max_failures=train.max_failures),
            callbacks=list(callbacks or []),
        ),
    )


def planned_worker_cpus(config: TrainingConfig) -> dict:
    """Fit or fail before Ray Train is asked for anything (the plan's table is logged): the
    `worker_cpus` argument of build_trainer when the plan lowered each worker's CPUs."""
    plan = check_training_plan(config)
    return {"worker_cpus": plan.worker_cpu} if plan is not None and plan.lowered else {}


def worker_resources(config: TrainingConfig, cpus: float | None = None) -> dict[str, float]:
    """What one Ray Train worker holds (its placement-group bundle): `cpus` from the resource
    plan, else train.cpus_per_worker."""
    resources = {"CPU": cpus if cpus is not None else config.train.cpus_per_worker}
    if config.train.use_gpu:
        resources["GPU"] = 1
    return resources


def export_checkpoint(config: TrainingConfig, checkpoint_dir: str, output_dir: str) -> str:
    """Rebuild the encoder, load a checkpoint's weights, write a sentence-transformers dir
    with a model card (the evaluations so far come from the checkpoint's loop state;
    run_card.finalize_export adds the run's final metrics)."""
    transformers.logging.set_verbosity_error()
    encoder = build_encoder(config.model, config.loss, config.train)
    load_encoder_weights(encoder, checkpoint_dir)
    tokenizer = AutoTokenizer.from_pretrained(
        config.model_path, trust_remote_code=config.model.trust_remote_code
    )
    # The base model's length, not the training one (model.max_seq_length: a speed choice).
    max_seq_length = export_max_seq_length(
        config.model_path, tokenizer, encoder.backbone.config, config.export.max_seq_length
    )
    if max_seq_length is None:
        max_seq_length = config.model.max_seq_length
        log.warning(
            "%s states no maximum length; the export keeps the training length %d "
            "(set export.max_seq_length to choose)",
            config.model_path,
            max_seq_length,
        )
    state_file = Path(checkpoint_dir) / STATE_FILE
    history = LoopState.from_json(state_file.read_text()).history if state_file.is_file() else []
    return export_sentence_transformer(
        encoder,
        tokenizer,
        output_dir,
        max_seq_length,
        include_mlp=config.model.mlp_head == "export",
        # A model that started with unit-length embeddings keeps them (cosine scores are the
        # same either way; dot-product users of e.g. all-MiniLM-L6-v2 rely on it).
        normalize=ends_with_normalize(config.model_path),
        card=card_info(config, history=history, max_seq_length=max_seq_length),
    )


def run_training(
    config: TrainingConfig, stream: TrainingStream | None = None, callbacks: list | None = None
) -> TrainingResult:
    """Train with Ray Train, export the best checkpoint (by eval.select_by: STS-B dev, or
    nDCG@10 on a split of eval.retrieval_dir) and write metrics.json.
    `stream`: what to train on (default: `config`'s corpus as indexed shards,
    data/training_stream.py).
    `callbacks`: Ray Train callbacks, run in the Train controller (infocse/overlap.py)."""
    started = time.time()
    config = train_on_documents(config)
    # From here on the settings are what the run uses, decided once and frozen.
    config = resolve_run(config)
    output = Path(config.output.dir)
    # With a storage path, the run's logs live beside its checkpoints (tracking.StoredLogs):
    # this process's lines from here on, rank 0's at every evaluation.
    stored = _stored_logs(config)
    log.info(failures_line(config))
    check_teacher(
        config.model, config.loss
    )  # a distillation teacher that cannot serve fails before Ray Train
    # Before any data or Ray work: an earlier run under this name is continued only when it
    # is this run (same settings) or the user said so (output.resume).
    run_name = prepare_run(config)
    output.mkdir(parents=True, exist_ok=True)
    if stream is None:
        stream = training_stream(config.data, config.stream_settings())
        log.info(stream.report.summary())
    # A checkpoint's data position must index this stream (a rebuilt or removed token cache,
    # other data settings): refused here, before Ray Train starts any worker.
    plan = batch_plan(config.data, config.train.global_batch)
    check_resumed_stream(config.output, run_name, stream.identity(plan))
    # Fit or fail before Ray Train is asked for anything (the table is in the log either way).
    trainer = build_trainer(
        config,
        stream,
        run_name,
        callbacks=callbacks,
        stored_logs=stored.location if stored is not None else None,
        **planned_worker_cpus(config),
    )
    with stored.every(DRIVER_LOG_UPLOAD_S) if stored is not None else contextlib.nullcontext():
        result = _fit_watched(trainer, config)
    if result.error is not None:
        raise result.error
    corpus_report = stream.report

    best = _best_checkpoint(result, config.eval.start_is_candidate)
    history = _history(result.checkpoint)
    model_dir = None
    if best is not None:
        with best.as_directory() as directory:
            model_dir = export_checkpoint(config, directory, str(output / "model"))
    first, last = (history[0], history[-1]) if history else ({}, {})
    if first.get("step") != 0:  # eval.score_start=false: the start was not scored here
        first = {}
    trained = [row for row in history if row.get("step", 0) > 0]
    chosen = best_row(history, config.eval.start_is_candidate) or {}
    metrics = {
        # What chose the export (eval.select_by), and its score at the start, at the end and
        # at the exported step.
        SELECT_BY: config.eval.select_by,
        "dev_before": first.get(SELECT_METRIC),
        "dev_after": last.get(SELECT_METRIC),
        "dev_best": chosen.get(SELECT_METRIC),
        # STS-B dev at the same three points whatever chose: a retrieval choice must not
        # quietly cost STS.
        "stsb_dev_before": first.get(DEV_METRIC),
        "stsb_dev_after": last.get(DEV_METRIC),
        "stsb_dev_best": chosen.get(DEV_METRIC),
        "best_step": chosen.get("step"),
        # "step <s>", or the one line that says the given model is handed back unchanged
        # (the start won: eval.start_is_candidate); the job prints it, the card carries it.
        "exported": exported_evaluation(
            history, config.eval.select_by, config.eval.start_is_candidate
        ),
        "steps": last.get("step"),
        "sentences_seen": last.get("sentences_seen"),
        "sentences_per_s": _mean([r.get("sentences_per_s") for r in trained]),
        "tokens_per_s": _mean([r.get("tokens_per_s") for r in trained]),
        "global_batch": config.train.global_batch,
        "truncated_rows": last.get("truncated"),
        "restarts": last.get("restarts", 0),
        "corpus": corpus_report.as_dict() if corpus_report is not None else None,
        "wall_time_s": round(time.time() - started, 1),
        "history": history,
        "model_dir": model_dir,
        "best_checkpoint": best.path if best is not None else None,
    }
    if model_dir is not None and config.eval.test_after_training:
        metrics["stsb_test"] = stsb_test(config, model_dir)
        if config.model.compression_head is None:  # a head's export is not the given model's
            metrics["yardsticks"] = compare_with_given(
                config.model_path, model_dir, config.eval, yardstick_encoders(config)
            )
            metrics["yardstick_warnings"] = warning_lines(metrics["yardsticks"])
    if model_dir is not None and config.export.backends:
        metrics["backends"] = export_backends(model_dir, config)
    if model_dir is not None:
        # The card gets the run's final numbers (corpus size, STS-B test, the serving
        # backends); pushes if asked.
        finalize_export(model_dir, config, metrics)
    # The curves from the checkpoint's history and rank 0's train_log.jsonl as storage holds
    # it (on a cluster rank 0 wrote its local copy on another node, which may be gone).
    train_log = join(stored.location, TRAIN_LOG) if stored is not None else output / TRAIN_LOG
    plot = write_run_plots(output, history, train_log)
    if config.output.storage_path:
        # The model, plots and metrics live beside the checkpoints, not only on this node.
        remote = run_uri(config.output.storage_path, run_name)
        if model_dir is not None:
            metrics["model_uri"] = copy_to_storage(model_dir, f"{remote}/model")
        if plot is not None:
            copy_to_storage(plot, join(remote, Path(plot).name))
        metrics["metrics_uri"] = f"{remote}/metrics.json"
        metrics["logs_uri"] = stored.location
    # Atomic: a run killed here leaves the previous metrics.json, never a truncated one.
    write_text_atomic(output / "metrics.json", json.dumps(metrics, indent=2, default=str))
    if config.output.storage_path:
        copy_to_storage(output / "metrics.json", metrics["metrics_uri"])
    if stored is not None:
        stored.close()  # the driver's last lines, and run.log merged once more
    return TrainingResult(model_dir, metrics["best_checkpoint"], metrics)


# While trainer.fit() runs, the driver's own lines reach storage this often (rank 0's at every
# evaluation): a job killed mid-run leaves what it logged up to then.
DRIVER_LOG_UPLOAD_S = 30.0


def _stored_logs(config: TrainingConfig) -> StoredLogs | None:
    """`<storage>/<run name>/logs` collecting this process's log lines (every logger: Ray
    Train's included, as run.log has them); None without output.storage_path."""
    if not config.output.storage_path:
        return None
    location = join(run_uri(config.output.storage_path, resolve_run_name(config)), LOGS_DIR)
    return StoredLogs(location, "driver", logging.getLogger())


def train_on_documents(config: TrainingConfig) -> TrainingConfig:
    """documents.paths (and no data.path yet): a copy of `config` that trains on the
    sentences of all but the held-out documents and scores the held-out ones
    (eval.documents_dir), prepared once under the token cache's root (train/
    document_corpus.py); any other config as it is. Ray must be up."""
    if not config.documents.paths or config.data.path is not None:
        return config
    prepared = prepare_documents(
        config.documents, config.heldout, config.stream_settings().token_cache_root
    )
    config = copy.deepcopy(config)
    config.data.path, config.data.text_column = prepared.sentences, TEXT_COLUMN
    config.eval.documents_dir = prepared.yardstick
    return config


def _fit_watched(trainer, config: TrainingConfig):
    """trainer.fit() under the stall watchdog (watchdog.py); a Tune trial's fit runs in
    a thread, unwatched (the search has its own plan check and watchdog)."""
    hint = (
        "fix: see the resource plan above (train.num_workers, train.cpus_per_worker, "
        "train.data_cpus) and docs/OPERATIONS.md, 'Sizing a cluster'"
    )
    with no_silent_stall(config.train.stall_timeout_s, hint=hint):
        return trainer.fit()


def _best_checkpoint(result, start_is_candidate: bool):
    """The kept checkpoint best by eval.select_by (selection.py's rule, the one
    metrics.json's best_step follows); without the step-0 one unless it may win. Falls back
    to the latest checkpoint."""
    kept = list(result.best_checkpoints or [])
    chosen = best_row([metrics for _, metrics in kept], start_is_candidate)
    if chosen is None:
        return result.checkpoint
    return next(checkpoint for checkpoint, metrics in kept if metrics is chosen)


def _history(last_checkpoint) -> list[dict]:
    """Every evaluation of the run, from the loop state in the last checkpoint (Ray keeps
    only the best few checkpoints' metrics)."""

    if last_checkpoint is None:
        return []
    with last_checkpoint.as_directory() as directory:
        return LoopState.from_json((Path(directory) / STATE_FILE).read_text()).history


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


# export.backends → the onnx/ variants model/onnx_export.py writes.
ONNX_VARIANTS = {"onnx": "fp32", "onnx_int8": "int8"}


def export_backends(model_dir: str, config: TrainingConfig) -> dict:
    """export.backends: the ONNX graph (every module of the export) and its variants written
    into <model_dir>/onnx/, each checked against the torch model on STS-B dev; what
    metrics.json keeps under "backends" (modules, and per variant its cosine agreement and
    Spearman)."""
    from distributed_emb.model.onnx_export import export_onnx  # startup
    from distributed_emb.model.onnx_files import write_export_info
    from distributed_emb.model.serving_check import serving_check

    variants = [ONNX_VARIANTS[name] for name in config.export.backends]
    info = export_onnx(model_dir, variants)
    checked = serving_check(model_dir, variants, config.eval.senteval_dir, config.eval.max_pairs)
    info["backends"] = checked
    write_export_info(model_dir, info)
    return {"modules": info["modules"], **checked}


def yardstick_encoders(config: TrainingConfig):
    """Models as the yardsticks encode them: in this process, the training pooler for a plain
    Hugging Face directory (the given model), an export's own modules otherwise."""

    def encoder_for(model_dir: str, max_seq_length: int | None):
        pooler = None if is_sentence_transformer_dir(model_dir) else config.model.pooler
        embedder = Embedder(
            model_dir,
            pooler=pooler,
            batch_size=config.eval.batch_size,
            max_seq_length=max_seq_length,
            device="cpu",
        )
        return embedder.embed

    return encoder_for


def stsb_test(config: TrainingConfig, model_dir: str) -> float | None:
    """STS-B test Spearman × 100 of an exported model (None when the data has no test split)."""
    embedder = Embedder(model_dir, batch_size=config.eval.batch_size, device="cpu")
    try:
        return stsb_score(embedder.embed, "test", config.eval.senteval_dir)
    except SentEvalDataError as error:
        log.warning("no STS-B test of %s: %s", model_dir, error)
        return None


# What a training job declares besides its description and default YAML (jobs/train_informin.py
# and jobs/finetune_mcr2.py: `Job(..., **TRAINING_STEPS)`).
TRAINING_STEPS = {
    "config_class": TrainingConfig,
    "prepare": prepare,
    "check": check,
    "plan": plan,
    "run": run,
    "earlier_run_flags": True,
}
