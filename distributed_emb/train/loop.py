"""train_loop_per_worker: what every Ray Train worker runs, readable top to bottom.

Rank 0 alone logs, evaluates STS-B dev and writes the checkpoint; every rank reports at the
same steps (Ray Train needs all workers to report the same number of times), and every rank
runs the same number of steps (gathers need every rank present).
"""

from __future__ import annotations

import logging
import random
import tempfile
import time

import torch

from distributed_emb import distributed
from distributed_emb.config import TrainingConfig, training_config_from_dict
from distributed_emb.data.collate import ContrastiveCollator
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
    threads = config.train.torch_threads or max(1, round(config.train.cpus_per_worker))
    torch.set_num_threads(threads)
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
    shard = ray.train.get_dataset_shard("train")
    progress = ProgressLog(total_steps, world * config.train.batch_size, enabled=rank == 0)

    truncated_since_report = torch.zeros((), dtype=torch.long, device=device)

    def evaluate_and_report(final: bool = False) -> None:
        nonlocal truncated_since_report
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
            **progress.window_means(),
            "final": final,
        }
        state.history.append({k: v for k, v in metrics.items() if k != "final"})
        progress.print_eval(state.step, score)
        _report(engine, state, metrics, loop_config["training"], rank)

    if state.step == 0 and not state.history:
        evaluate_and_report()  # the starting point, so a run shows whether training helped

    checkpoint_every = config.train.checkpoint_steps or config.eval.eval_steps
    while state.step < total_steps:
        batches = shard.iter_torch_batches(
            batch_size=config.train.batch_size,
            collate_fn=collate,
            drop_last=True,
            device=device,
            local_shuffle_buffer_size=(
                None if config.data.shuffle_seed is None else 4 * config.train.batch_size
            ),
            local_shuffle_seed=config.train.seed + 1000 * state.epoch + rank,
        )
        for index, batch in enumerate(batches):
            if index >= batches_per_epoch:
                break  # every rank stops at the same count
            if index < state.batches_in_epoch:
                continue  # resumed mid-epoch: these batches were trained on before the restart
            started = time.perf_counter()
            micro = state.batches_in_epoch % accumulation
            metrics = step_fn(engine, batch, weights, sync=micro == accumulation - 1)
            state.batches_in_epoch += 1
            if micro != accumulation - 1:
                continue
            engine.step()
            state.step += 1
            sentences = world * config.train.batch_size * accumulation
            state.sentences_seen += sentences
            truncated_since_report += batch["num_truncated"]
            progress.record(
                metrics,
                engine.lr,
                sentences,
                time.perf_counter() - started,
                batch["num_real_tokens"] * world,
            )
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
