"""train_loop_per_worker: what every Ray Train worker runs, readable top to bottom.

Rank 0 alone logs, evaluates STS-B dev and writes the checkpoint; every rank reports at the
same steps (Ray Train needs all workers to report the same number of times), and every rank
runs the same number of steps (gathers need every rank present).
"""

from __future__ import annotations

import logging
import math
import random
import resource
import tempfile
import time
from collections.abc import Iterable, Iterator

import numpy as np
import torch

from distributed_emb import distributed
from distributed_emb.config import TrainingConfig, training_config_from_dict
from distributed_emb.data.collate import ContrastiveCollator, LengthGroupedCollator
from distributed_emb.data.epoch_stream import (
    TrainedRowLog,
    epoch_batches,
    load_epoch_rows,
    save_epoch_rows,
)
from distributed_emb.evaluation.sts import stsb_score
from distributed_emb.losses.objective import ObjectiveWeights
from distributed_emb.model.embedder import embed_module
from distributed_emb.model.encoder import TrainableEncoder
from distributed_emb.train.checkpointing import LoopState, load_loop_state, save_loop_state
from distributed_emb.train.engine import build_engine
from distributed_emb.train.grad_cache import cached_step
from distributed_emb.train.progress import ProgressLog
from distributed_emb.train.step import plain_step

log = logging.getLogger(__name__)

DEV_METRIC = "stsb_dev_spearman"


def build_encoder(config: TrainingConfig) -> TrainableEncoder:
    return TrainableEncoder(
        config.model_path,
        pooler=config.model.pooler,
        mlp_head=config.model.mlp_head != "none",
        with_mlm_head=config.loss.mlm_weight > 0,
        trust_remote_code=config.model.trust_remote_code,
    )


def plan_steps(config: TrainingConfig, num_rows: int | None, world_size: int) -> int:
    """Optimizer steps in total (what the learning-rate schedule spans).

    `num_rows` None: the corpus was not counted (a stream with `train.max_steps` set), and the
    run takes `max_steps` steps unless its epochs run out first."""
    if num_rows is None:
        if config.train.max_steps is None:
            raise ValueError("an uncounted corpus needs train.max_steps")
        return config.train.max_steps
    batches_per_epoch = num_rows // (world_size * config.train.batch_size)
    if batches_per_epoch < config.train.gradient_accumulation_steps:
        raise ValueError(
            f"{num_rows} rows give no full step at batch_size {config.train.batch_size} × "
            f"{world_size} workers × {config.train.gradient_accumulation_steps} accumulation"
        )
    steps = config.train.epochs * batches_per_epoch // config.train.gradient_accumulation_steps
    if config.train.max_steps is not None:
        steps = min(steps, config.train.max_steps)
    return steps


def train_loop_per_worker(loop_config: dict) -> None:
    import ray.train
    import ray.train.torch
    import transformers
    from transformers import AutoTokenizer

    transformers.logging.set_verbosity_error()  # no per-worker weight-loading reports
    config = training_config_from_dict(loop_config["training"])
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    torch.set_num_threads(worker_threads(config))
    # A different seed per rank: each worker's dropout masks must differ.
    torch.manual_seed(config.train.seed + rank)
    random.seed(config.train.seed + rank)
    device = ray.train.torch.get_device()

    tokenizer = AutoTokenizer.from_pretrained(
        config.model_path, trust_remote_code=config.model.trust_remote_code
    )
    encoder = build_encoder(config)
    encoder.train()  # from_pretrained returns eval mode: without this there is no dropout noise
    total_steps = plan_steps(config, loop_config["num_rows"], world)
    engine = build_engine(encoder, config.train, total_steps, device)
    if rank == 0 and config.train.precision == "auto":
        log.warning("train.precision=auto: %s on %s", getattr(engine, "precision", "?"), device)
    weights = ObjectiveWeights.from_config(config.loss)
    accumulation = config.train.gradient_accumulation_steps
    step_fn = _step_function(config)

    state = LoopState()
    # Row ids every rank trained on in the current epoch before the checkpoint: skipped when
    # the epoch resumes (the union of all ranks, so a changed worker count stays exact too).
    trained_before = np.zeros(0, dtype=np.int64)
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            engine.load(directory)
            state = load_loop_state(directory, rank)
            trained_before = load_epoch_rows(directory)
        state.restarts += 1
        if rank == 0:
            log.warning(
                "resumed from step %d (epoch %d, batch %d)",
                state.step,
                state.epoch,
                state.batches_in_epoch,
            )

    collate = ContrastiveCollator(
        tokenizer,
        config.model.max_seq_length,
        kind=config.data.kind,
        text_column=config.data.text_column,
        anchor_column=config.data.anchor_column,
        positive_column=config.data.positive_column,
        group_column=config.data.group_column,
        mlm_probability=config.loss.mlm_probability if config.loss.mlm_weight > 0 else None,
        seed=config.train.seed + rank,
    )
    # Length grouping: pools of `group` batches, which the collator cuts into `group` batches
    # of similar length.
    group = max(1, config.data.length_group_batches)
    if group > 1:
        collate = LengthGroupedCollator(collate, config.train.batch_size, config.train.seed + rank)
    epoch_rows: list[np.ndarray] = [trained_before]  # this epoch's trained row ids, all ranks
    row_log = TrainedRowLog(config.output.dir, rank) if config.output.row_log else None
    shard = ray.train.get_dataset_shard("train")
    progress = ProgressLog.for_worker(config, total_steps, world, rank, start_step=state.step)

    truncated_since_report = torch.zeros((), dtype=torch.long, device=device)

    def evaluate_and_report(final: bool = False) -> None:
        nonlocal truncated_since_report
        # The training window closes here and reopens after the checkpoint: evaluation and
        # checkpoint writing are not training throughput.
        window = progress.window_means()
        state.truncated += int(distributed.all_reduce_sum(truncated_since_report))
        truncated_since_report = torch.zeros_like(truncated_since_report)
        score = _dev_score(encoder, tokenizer, config) if rank == 0 else 0.0
        score = distributed.broadcast_object(score)
        metrics = {
            DEV_METRIC: score,
            "step": state.step,
            "epoch": state.epoch,
            "sentences_seen": state.sentences_seen,
            "truncated": state.truncated,
            "restarts": state.restarts,
            **window,
            "peak_rss_mb": peak_rss_mb(),
            "final": final,
        }
        state.history.append({k: v for k, v in metrics.items() if k != "final"})
        progress.print_eval(state.step, score, metrics)
        _report(engine, state, metrics, loop_config["training"], rank, epoch_rows)
        progress.restart_clock()

    if state.step == 0 and not state.history:
        evaluate_and_report()  # the starting point, so a run shows whether training helped

    report_every = config.train.report_steps or config.eval.eval_steps
    while state.step < total_steps and state.epoch < config.train.epochs:
        skip = np.concatenate(epoch_rows) if state.batches_in_epoch else None
        pools = epoch_batches(
            shard,
            config.train.batch_size * group,
            None if config.data.shuffle_seed is None else config.data.shuffle_buffer_rows,
            seed=(config.data.shuffle_seed or 0) + 1000 * state.epoch + rank,
            skip=skip,
            # A last partial pool still gives its whole batches (length grouping).
            last_at_least=config.train.batch_size if group > 1 else None,
        )
        # Per optimizer step (summed over its micro-batches): seconds waiting for batches,
        # seconds computing, real tokens. Plain numbers and tensors: no host/device sync.
        waited, computed, real_tokens = 0.0, 0.0, 0
        for batch, wait in _timed(_collated(pools, collate, device)):
            # Every rank must take the same steps (gathers wait for all): the epoch ends for
            # all as soon as one rank's shard runs out.
            if not distributed.all_ranks(batch is not None):
                break
            waited += wait
            started = time.perf_counter()
            micro = state.batches_in_epoch % accumulation
            metrics = step_fn(engine, batch, weights, sync=micro == accumulation - 1)
            state.batches_in_epoch += 1
            epoch_rows.append(batch["row_ids"].cpu().numpy())
            if row_log is not None:
                row_log.write(state, epoch_rows[-1])
            truncated_since_report += batch["num_truncated"]
            real_tokens = real_tokens + batch["num_real_tokens"]
            if micro != accumulation - 1:
                computed += time.perf_counter() - started
                continue
            engine.step()
            computed += time.perf_counter() - started
            state.step += 1
            sentences = world * config.train.batch_size * accumulation
            state.sentences_seen += sentences
            progress.record(metrics, engine.lr, sentences, computed, real_tokens * world, waited)
            waited, computed, real_tokens = 0.0, 0.0, 0
            last = state.step == total_steps
            if state.step % config.eval.eval_steps == 0 or last:
                evaluate_and_report(final=last)
            elif state.step % report_every == 0:
                evaluate_and_report()
            if last:
                break
        if state.step < total_steps:
            state.epoch += 1
            state.batches_in_epoch = 0
            epoch_rows = [np.zeros(0, dtype=np.int64)]
    if state.step == 0:
        raise ValueError(
            f"the corpus gave no full step: rank {rank}'s shard has fewer than "
            f"batch_size × gradient_accumulation_steps = {config.train.batch_size * accumulation}"
            f" rows (world size {world}); use a larger corpus or a smaller batch"
        )
    if state.history and state.history[-1].get("step") != state.step:
        # The corpus ran out before total_steps (an uncounted stream): the last step is final.
        if rank == 0:
            log.warning("the corpus ended after %d of %d planned steps", state.step, total_steps)
        evaluate_and_report(final=True)
    progress.close()


def worker_threads(config: TrainingConfig) -> int:
    """Torch threads per worker: `train.torch_threads`, else the worker's CPUs rounded up
    (2.5 CPUs → 3 threads; Python's round() would give 2: it rounds halves to even)."""
    return config.train.torch_threads or max(1, math.ceil(config.train.cpus_per_worker))


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MiB.

    VmHWM from /proc (Linux) is this process image's own high-water mark; ru_maxrss, the
    fallback elsewhere, also keeps the RSS of the parent the process was forked from.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _collated(pools: Iterable[dict], collate, device: torch.device) -> Iterator[dict | None]:
    """Training batches on the device (a pool gives one batch, or several when length-grouped),
    then None for as long as the caller asks: this rank's shard has run out."""
    for pool in pools:
        collated = collate(pool)
        for batch in collated if isinstance(collated, list) else [collated]:
            yield {key: value.to(device, non_blocking=True) for key, value in batch.items()}
    while True:
        yield None


def _timed(batches: Iterable) -> Iterator[tuple[object, float]]:
    """(batch, seconds the loop waited for it): time the data path left compute idle."""
    iterator = iter(batches)
    while True:
        asked = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            return
        yield batch, time.perf_counter() - asked


def _step_function(config: TrainingConfig):
    if (
        config.train.mini_batch_size is not None
        and config.train.mini_batch_size < config.train.batch_size
    ):
        return lambda engine, batch, weights, sync: cached_step(
            engine, batch, weights, config.train.mini_batch_size, sync
        )
    return plain_step


def _dev_score(encoder: TrainableEncoder, tokenizer, config: TrainingConfig) -> float:
    """STS-B dev of the module being trained, embedded as its export will embed."""
    include_mlp = config.model.mlp_head == "export"

    def encode(sentences: list[str]):
        return embed_module(
            encoder,
            tokenizer,
            sentences,
            config.model.max_seq_length,
            config.eval.batch_size,
            include_mlp,
        )

    return stsb_score(encode, "dev", config.eval.senteval_dir, config.eval.max_pairs)


def _report(
    engine, state: LoopState, metrics: dict, config_dict: dict, rank: int, epoch_rows: list
) -> None:
    import ray.train

    with tempfile.TemporaryDirectory() as directory:
        if rank == 0 or engine.saves_on_every_rank:
            engine.save(directory)
        # Every rank adds its own RNG and trained-rows files; Ray merges the ranks' files into
        # one checkpoint.
        save_loop_state(directory, state, config_dict, rank)
        save_epoch_rows(directory, rank, epoch_rows)
        checkpoint = ray.train.Checkpoint.from_directory(directory)
        ray.train.report(metrics, checkpoint=checkpoint)
