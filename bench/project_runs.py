"""The project's own training path, timed from inside: a real Ray Train run of
`train_loop_per_worker` (TorchTrainer, InforMin-CL loss, the shipped corpus through the
project's one data path: Ray Data read, clean and tokenise into indexed shards, each rank
reading its own slice of every global batch), with throughput read back from the loop's own
progress windows.

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
    # What run_training trains on: the corpus's token shards, each of the W ranks its slices.
    stream = training_stream(config.data, config.stream_settings())
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
    """The rows the project trains on in this config's first epoch, in its order (Ray must be
    up): the config's token shards (built now or reused) cut as the ranks cut them, read as
    one rank of one, each row's text looked up by its row id in the corpus read in this
    process. The baselines train on the same sentences."""
    import pyarrow.compute as pc

    from distributed_emb.data.corpus import corpus_path, text_rules
    from distributed_emb.data.epoch_plan import DataPosition, batch_plan
    from distributed_emb.data.rank_batches import RankBatches
    from distributed_emb.data.readers import DROP, ROW_ID, iter_parsed_blocks
    from distributed_emb.data.sources import resolve_sources
    from distributed_emb.data.training_stream import training_stream

    stream = training_stream(config.data, config.stream_settings())
    plan = batch_plan(config.data, config.train.global_batch)
    row_ids = [
        row
        for table, _ in RankBatches(stream.source, plan, 0, 1).epoch(DataPosition())
        for row in table.column(ROW_ID).to_pylist()
    ]
    column = config.data.text_column
    texts: dict[int, str] = {}
    files = resolve_sources(corpus_path(config.data), config.data.hf_split)
    for block in iter_parsed_blocks(files, text_rules(config.data)):
        kept = block.filter(pc.equal(block.column(DROP), ""))
        texts.update(zip(kept.column(ROW_ID).to_pylist(), kept.column(column).to_pylist()))
    return [texts[row] for row in row_ids]


def scratch_dir(parent: str | None, prefix: str) -> str:
    return tempfile.mkdtemp(prefix=prefix, dir=parent)
