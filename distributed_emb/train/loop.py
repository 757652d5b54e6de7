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

import torch

from distributed_emb import distributed
from distributed_emb.config import TrainingConfig, training_config_from_dict
from distributed_emb.data.collate import ContrastiveCollator, LengthGroupedCollator
from distributed_emb.losses.objective import ObjectiveWeights
from distributed_emb.model.encoder import SentenceEncoder
from distributed_emb.train.checkpointing import LoopState, load_loop_state, save_loop_state
from distributed_emb.train.engine import build_engine
from distributed_emb.train.progress import ProgressLog
from distributed_emb.train.step import plain_step

log = logging.getLogger(__name__)

DEV_METRIC = "stsb_dev_spearman"


def build_encoder(config: TrainingConfig) -> SentenceEncoder:
    return SentenceEncoder(
        config.model_path,
        pooler=config.model.pooler,
        mlp_head=config.model.mlp_head != "none",
        with_mlm_head=config.loss.mlm_weight > 0,
        trust_remote_code=config.model.trust_remote_code,
    )


def plan_steps(config: TrainingConfig, num_rows: int, world_size: int) -> tuple[int, int]:
    """(batches per epoch per worker, optimizer steps in total), equal on every rank."""
    batches_per_epoch = num_rows // (world_size * config.train.batch_size)
    if batches_per_epoch < config.train.gradient_accumulation_steps:
        raise ValueError(
            f"{num_rows} rows give no full step at batch_size {config.train.batch_size} × "
            f"{world_size} workers × {config.train.gradient_accumulation_steps} accumulation"
        )
    steps = config.train.epochs * batches_per_epoch // config.train.gradient_accumulation_steps
    if config.train.max_steps is not None:
        steps = min(steps, config.train.max_steps)
    return batches_per_epoch, steps


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
    batches_per_epoch, total_steps = plan_steps(config, loop_config["num_rows"], world)
    engine = build_engine(encoder, config.train, total_steps, device)
    weights = ObjectiveWeights.from_config(config.loss)
    accumulation = config.train.gradient_accumulation_steps
    step_fn = _step_function(config)

    state = LoopState()
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            engine.load(directory)
            state = load_loop_state(directory, rank)
        state.restarts += 1
        if rank == 0:
            log.warning(
                "resumed from step %d (epoch %d, batch %d)",
                state.step,
                state.epoch,
                state.batches_in_epoch,
            )

    dev = _load_dev(config) if rank == 0 else None
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
    # Length grouping: Ray hands over pools of `group` batches, the collator cuts each pool
    # into `group` batches of similar length (a list, which Ray does not move to the device).
    group = max(1, config.data.length_group_batches)
    if group > 1:
        collate = LengthGroupedCollator(collate, config.train.batch_size, config.train.seed + rank)
    shard = ray.train.get_dataset_shard("train")
    progress = ProgressLog(total_steps, world * config.train.batch_size, enabled=rank == 0)

    truncated_since_report = torch.zeros((), dtype=torch.long, device=device)

    def evaluate_and_report(final: bool = False) -> None:
        nonlocal truncated_since_report
        # The training window closes here and reopens after the checkpoint: evaluation and
        # checkpoint writing are not training throughput.
        window = progress.window_means()
        state.truncated += int(distributed.all_reduce_sum(truncated_since_report))
        truncated_since_report = torch.zeros_like(truncated_since_report)
        score = _dev_score(encoder, tokenizer, dev, config) if rank == 0 else 0.0
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
        progress.print_eval(state.step, score)
        _report(engine, state, metrics, loop_config["training"], rank)
        progress.restart_clock()

    if state.step == 0 and not state.history:
        evaluate_and_report()  # the starting point, so a run shows whether training helped

    checkpoint_every = config.train.checkpoint_steps or config.eval.eval_steps
    while state.step < total_steps:
        batches = shard.iter_torch_batches(
            batch_size=config.train.batch_size * group,
            collate_fn=collate,
            drop_last=group == 1,  # a last partial pool still gives its whole batches
            device=device if group == 1 else "cpu",
            local_shuffle_buffer_size=(
                None if config.data.shuffle_seed is None else 4 * config.train.batch_size * group
            ),
            local_shuffle_seed=config.train.seed + 1000 * state.epoch + rank,
        )
        if group > 1:
            batches = _ungrouped(batches, device)
        # Per optimizer step (summed over its micro-batches): seconds waiting for batches,
        # seconds computing, real tokens. Plain numbers and tensors: no host/device sync.
        waited, computed, real_tokens = 0.0, 0.0, 0
        for index, (batch, wait) in enumerate(_timed(batches)):
            if index >= batches_per_epoch:
                break  # every rank stops at the same count
            if index < state.batches_in_epoch:
                continue  # resumed mid-epoch: these batches were trained on before the restart
            waited += wait
            started = time.perf_counter()
            micro = state.batches_in_epoch % accumulation
            metrics = step_fn(engine, batch, weights, sync=micro == accumulation - 1)
            state.batches_in_epoch += 1
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
            elif state.step % checkpoint_every == 0:
                evaluate_and_report()
            if last:
                break
        if state.step < total_steps:
            state.epoch += 1
            state.batches_in_epoch = 0
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


def _ungrouped(pools: Iterable[list[dict]], device: torch.device) -> Iterator[dict]:
    """Each pool's batches in turn, moved to the training device."""
    for pool in pools:
        for batch in pool:
            yield {key: value.to(device, non_blocking=True) for key, value in batch.items()}


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
        from distributed_emb.train.grad_cache import cached_step

        return lambda engine, batch, weights, sync: cached_step(
            engine, batch, weights, config.train.mini_batch_size, sync
        )
    return plain_step


def _load_dev(config: TrainingConfig):
    from distributed_emb.evaluation.senteval_data import StsData, read_sts_benchmark
    from distributed_emb.paths import shipped_senteval_dir

    dev = read_sts_benchmark(config.eval.senteval_dir or shipped_senteval_dir(), "dev")
    if config.eval.max_pairs is not None:
        n = config.eval.max_pairs
        dev = StsData(dev.sentences1[:n], dev.sentences2[:n], dev.scores[:n], dev.name)
    return dev


def _dev_score(encoder, tokenizer, dev, config: TrainingConfig) -> float:
    from distributed_emb.evaluation.sts import sts_spearman

    include_mlp = config.model.mlp_head == "export"

    def encode(sentences: list[str]):
        return encoder.encode(
            sentences, tokenizer, config.model.max_seq_length, config.eval.batch_size, include_mlp
        )

    return sts_spearman(encode, dev)


def _report(engine, state: LoopState, metrics: dict, config_dict: dict, rank: int) -> None:
    import ray.train

    with tempfile.TemporaryDirectory() as directory:
        if rank == 0 or engine.saves_on_every_rank:
            engine.save(directory)
        # Every rank adds its own RNG file; Ray merges the ranks' files into one checkpoint.
        save_loop_state(directory, state, config_dict, rank)
        checkpoint = ray.train.Checkpoint.from_directory(directory)
        ray.train.report(metrics, checkpoint=checkpoint)
