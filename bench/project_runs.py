"""The project's own training path, timed from inside: a real Ray Train run of
`train_loop_per_worker` (TorchTrainer, InforMin-CL loss, the shipped corpus through the
project's stream: Ray Data read and clean tasks, one feeder of global batches, each rank its
slice), with throughput read back from the loop's own progress windows.

The loop closes a window before each evaluation and reopens it after the checkpoint, so
evaluation and checkpoint writing never count; the first window (pipeline start-up, first
steps) is the warm-up and is left out. What is left is exactly what a user's run gets per step:
data waits, tokenisation, forward, backward, optimizer and Ray's own work.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from distributed_emb.config import TrainingConfig, load_config

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "jobs" / "configs" / "informin_default.yaml"


@dataclass
class ProjectRun:
    workers: int
    gather: bool
    sentences_per_s: float  # global, steady-state windows
    tokens_per_s: float  # real tokens, both views, global
    step_s: float  # wall seconds per optimizer step
    data_wait_fraction: float  # of the steady windows' wall time
    compute_fraction: float
    peak_rss_mb: float  # rank 0's worker process
    global_batch: int  # sentences per optimizer step, all workers
    negatives_per_row: int  # candidates in each row's softmax
    run_seconds: float  # the whole fit(): start-up, evaluations, checkpoints included


def project_config(
    model_path: str,
    batch_size: int,
    max_seq_length: int,
    workers: int,
    threads: int,
    warmup_steps: int,
    steps: int,
    gather: bool,
    output_dir: str,
    extra: list[str] = (),
) -> TrainingConfig:
    """The default InforMin-CL config with the benchmark's shape: an evaluation (3 STS-B pairs,
    so it is cheap) every `warmup_steps`, which closes one timing window each."""
    steps = -(-steps // warmup_steps) * warmup_steps  # whole windows
    total = warmup_steps + steps
    overrides = [
        f"model.path={model_path}",
        f"model.max_seq_length={max_seq_length}",
        f"data.max_rows={(total + 1) * batch_size * workers}",
        f"train.num_workers={workers}",
        f"train.cpus_per_worker={threads}",
        f"train.torch_threads={threads}",
        f"train.batch_size={batch_size}",
        f"train.max_steps={total}",
        f"loss.gather_negatives={str(gather).lower()}",
        f"eval.eval_steps={warmup_steps}",
        "eval.max_pairs=3",
        "eval.test_after_training=false",
        f"output.dir={output_dir}",
        f"output.storage_path={Path(output_dir).resolve() / 'ray_results'}",
        "output.checkpoints_to_keep=1",
        *extra,
    ]
    return load_config(TrainingConfig, str(DEFAULT_CONFIG), overrides)


def run_project(config: TrainingConfig, warmup_steps: int) -> ProjectRun:
    """One TorchTrainer fit (Ray must be running); steady-state numbers from its windows."""
    from distributed_emb.data.training_stream import training_stream
    from distributed_emb.train.checkpointing import STATE_FILE, LoopState
    from distributed_emb.train.driver import build_trainer, planned_worker_cpus

    started = time.perf_counter()
    stream = training_stream(
        config.data, config.stream_settings()
    )  # what run_training trains on: one feeder, W ranks
    # A fresh run name each time: a run must never resume an earlier contender's checkpoint.
    run_name = f"bench-{uuid.uuid4().hex[:8]}"
    trainer = build_trainer(config, stream, run_name=run_name, **planned_worker_cpus(config))
    result = trainer.fit()
    if result.error is not None:
        raise result.error
    with result.checkpoint.as_directory() as directory:
        history = LoopState.from_json((Path(directory) / STATE_FILE).read_text()).history
    run_seconds = time.perf_counter() - started
    shutil.rmtree(config.output.storage_path, ignore_errors=True)  # checkpoints are large

    steady = [row for row in history if row["step"] > warmup_steps and row.get("window_steps")]
    if not steady:
        raise RuntimeError(f"no steady-state window in the run's history: {history}")
    wall = sum(row["window_s"] for row in steady)
    steps = sum(row["window_steps"] for row in steady)
    workers = config.train.num_workers
    global_batch = workers * config.train.batch_size
    return ProjectRun(
        workers=workers,
        gather=config.loss.gather_negatives,
        sentences_per_s=steps * global_batch / wall,
        tokens_per_s=sum(row["tokens_per_s"] * row["window_s"] for row in steady) / wall,
        step_s=wall / steps,
        data_wait_fraction=sum(row["data_wait_s"] for row in steady) / wall,
        compute_fraction=sum(row["compute_fraction"] * row["window_s"] for row in steady) / wall,
        peak_rss_mb=max(row["peak_rss_mb"] for row in history),
        global_batch=global_batch,
        negatives_per_row=global_batch if config.loss.gather_negatives else config.train.batch_size,
        run_seconds=run_seconds,
    )


def bench_texts(config: TrainingConfig) -> list[str]:
    """The rows the project trains on in this config's first epoch, in its order (the
    single-process reference of the feeder's global batches, data/global_batches.py): the
    baselines train on the same sentences."""
    from distributed_emb.data.epoch_order import DataPosition, EpochOrder
    from distributed_emb.data.global_batches import batch_plan, global_batches
    from distributed_emb.data.stream import local_epoch_tables, text_source

    plan = batch_plan(config.data, config.train.global_batch)
    start = DataPosition()
    tables = local_epoch_tables(
        text_source(config.data, counter=None), EpochOrder(plan.seed, start.epoch), start
    )
    texts: list[str] = []
    for batch, _ in global_batches(tables, plan, start):
        texts += batch.column(config.data.text_column).to_pylist()
    return texts


def scratch_dir(parent: str | None, prefix: str) -> str:
    return tempfile.mkdtemp(prefix=prefix, dir=parent)
