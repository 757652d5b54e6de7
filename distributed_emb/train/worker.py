"""train_loop_per_worker: what every Ray Train worker runs, readable top to bottom.

Rank 0 alone logs and writes the checkpoint; every rank embeds a share of each evaluation
(STS-B dev, and the eval.retrieval_dir splits); every rank reports at the same steps (Ray Train
needs all workers to report the same number of times), and every rank runs the same number of
steps (gathers need every rank present).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import resource
import tempfile
import time
from collections.abc import Iterable, Iterator

import numpy as np
import ray.train
import ray.train.torch
import torch
import transformers
from transformers import AutoTokenizer

from distributed_emb import distributed, storage
from distributed_emb.config import training_config_from_dict
from distributed_emb.data.batches import TrainedRowLog, numpy_batch
from distributed_emb.data.collate import ContrastiveCollator
from distributed_emb.data.data_config import DataConfig
from distributed_emb.data.epoch_plan import DataPosition, batch_plan, split_rows
from distributed_emb.data.rank_batches import RankBatches
from distributed_emb.data.training_stream import check_same_stream
from distributed_emb.evaluation.beir import RetrievalSplit, list_splits, read_splits, score_splits
from distributed_emb.evaluation.eval_config import EvalConfig
from distributed_emb.evaluation.sts import stsb_score
from distributed_emb.losses.loss_config import LossConfig
from distributed_emb.model.compression_head import load_head
from distributed_emb.model.embedder import embed_module
from distributed_emb.model.encoder import TrainableEncoder
from distributed_emb.model.model_card import config_position_limit
from distributed_emb.model.model_config import ModelConfig
from distributed_emb.selection import (
    DEV_METRIC,
    SELECT_METRIC,
    documents_metric,
    retrieval_metric,
    scored_splits,
    selected_metric,
)
from distributed_emb.train.checkpointing import LoopState, load_loop_state, save_loop_state
from distributed_emb.train.engine import build_engine
from distributed_emb.train.grad_cache import cached_step
from distributed_emb.train.precision import resolve_precision
from distributed_emb.train.progress import ProgressLog
from distributed_emb.train.step import plain_step
from distributed_emb.train.teacher import Teacher
from distributed_emb.train.train_config import TrainLoopConfig

log = logging.getLogger(__name__)


def build_encoder(model: ModelConfig, loss: LossConfig, train: TrainLoopConfig) -> TrainableEncoder:
    """The encoder a run trains (and its export rebuilds): model.*, with the MLM head when the
    loss uses it, compiled when train.compile."""
    head_dir = model.compression_head
    encoder = TrainableEncoder(
        model.local_path(),
        pooler=model.pooler,
        mlp_head=model.mlp_head != "none",
        with_mlm_head=loss.mlm_weight > 0,
        trust_remote_code=model.trust_remote_code,
        compression_head=load_head(head_dir) if head_dir else None,
    )
    if train.compile:
        encoder.compile_backbone()
    return encoder


def plan_steps(train: TrainLoopConfig, num_rows: int) -> int:
    """Optimizer steps in total (what the learning-rate schedule spans): the epochs of
    `num_rows` clean rows (the shards' count), at most `train.max_steps`."""
    # The global batch is the same for every group size (elastic groups included), so the
    # schedule is too.
    batches_per_epoch = num_rows // train.global_batch
    if batches_per_epoch < train.gradient_accumulation_steps:
        raise ValueError(
            f"{num_rows} rows give no full step at a global batch of "
            f"{train.global_batch} × {train.gradient_accumulation_steps} "
            "accumulation"
        )
    steps = train.epochs * batches_per_epoch // train.gradient_accumulation_steps
    if train.max_steps is not None:
        steps = min(steps, train.max_steps)
    return steps


def train_loop_per_worker(loop_config: dict) -> None:
    """What every Ray Train worker runs: set up (or restore), score the start, train epoch by
    epoch until the planned steps are done, close."""
    run = WorkerRun(loop_config)
    if run.state.step == 0 and not run.state.history and run.config.eval.score_start:
        run.evaluate_and_report()  # the starting point, so a run shows whether training helped
    while run.wants_another_epoch():
        run.train_epoch()
    run.finish()


class WorkerRun:
    """One worker's training run: the model, engine and data it trains with and the loop
    state a checkpoint saves. Its methods are the loop's steps, in the order they run."""

    def __init__(self, loop_config: dict):
        transformers.logging.set_verbosity_error()  # no per-worker weight-loading reports
        self.config_dict = loop_config["training"]
        config = self.config = training_config_from_dict(self.config_dict)
        context = ray.train.get_context()
        self.rank, self.world = context.get_world_rank(), context.get_world_size()
        # An elastic group of any size trains the same global batch G = train.global_batch, so
        # the config keeps num_workers and batch_size as declared (W need not divide G, and no
        # W × rows would give G): this worker's rows are split_rows' ⌊G/W⌋ or ⌈G/W⌉.
        torch.set_num_threads(worker_threads(config.train))
        # A different seed per rank: each worker's dropout masks must differ.
        torch.manual_seed(config.train.seed + self.rank)
        random.seed(config.train.seed + self.rank)
        self.device = ray.train.torch.get_device()

        self.tokenizer = AutoTokenizer.from_pretrained(
            config.model_path, trust_remote_code=config.model.trust_remote_code
        )
        self.encoder = build_encoder(config.model, config.loss, config.train)
        self.encoder.train()  # from_pretrained gives eval mode: without this, no dropout noise
        self.total_steps = plan_steps(config.train, loop_config["num_rows"])
        self.engine = build_engine(
            self.encoder, self._decided_precision(), self.total_steps, self.device
        )
        self.weights = config.loss
        # Distillation's frozen teacher (loss.distill_weight, or MCR²'s μ): its vectors are
        # each batch's targets, computed before the step (train/teacher.py).
        self.teacher = (
            Teacher(config.model, config.loss, self.device) if self.weights.needs_teacher else None
        )
        self.accumulation = config.train.gradient_accumulation_steps
        self.step_fn = _step_function(config.train, self.world)

        self.state = LoopState()
        self._restore()
        # What the data position indexes; a checkpoint of another stream is refused (the
        # driver checks first, before Ray Train starts; this covers Ray Train's own restarts).
        check_same_stream(self.state.stream, loop_config["stream"], "the restored checkpoint")
        self.state.stream = loop_config["stream"]

        # eval.retrieval_dir's splits, read once: every evaluation searches them again.
        self.retrieval = retrieval_splits(config.eval)
        self.documents = retrieval_splits(config.eval, documents=True)
        self.collate = _collator(
            config.model, config.data, config.loss, self.tokenizer, config.train.seed + self.rank
        )
        self.row_log = (
            TrainedRowLog(config.output.dir, self.rank) if config.output.row_log else None
        )
        # The run's one stream of global batches: this rank's slices of them, read by the rank
        # itself from the indexed shards (data/rank_batches.py).
        self.stream = RankBatches(
            loop_config["source"],
            batch_plan(config.data, config.train.global_batch),
            self.rank,
            self.world,
        )
        self.progress = ProgressLog.for_worker(
            config,
            self.total_steps,
            self.rank,
            start_step=self.state.step,
            stored_logs=loop_config.get("stored_logs"),
        )
        self.truncated_since_report = torch.zeros((), dtype=torch.long, device=self.device)

    def _decided_precision(self) -> TrainLoopConfig:
        """train.precision=auto is decided on rank 0 and broadcast: on CPUs it is timed, and
        ranks that decided apart would train one model in two precisions."""
        train = self.config.train
        if train.precision != "auto":
            return train
        choice = resolve_precision("auto", self.device) if self.rank == 0 else None
        choice = distributed.broadcast_object(choice)
        if self.rank == 0:
            log.warning("train.precision=auto: %s on %s", choice, self.device)
        return dataclasses.replace(train, precision=choice)

    def _restore(self) -> None:
        """Load the checkpoint Ray hands a restarted (or resized) run: weights, optimizer,
        loop state and the data position, which is all a resumed epoch needs."""
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return
        with checkpoint.as_directory() as directory:
            self.engine.load(directory)
            self.state = load_loop_state(directory, self.rank)
        self.state.restarts += 1
        if self.rank == 0:
            state = self.state
            log.warning(
                "resumed from step %d (epoch %d, batch %d) on %d workers, data position %s",
                state.step,
                state.epoch,
                state.batches_in_epoch,
                self.world,
                state.position,
            )

    def wants_another_epoch(self) -> bool:
        return self.state.step < self.total_steps and self.state.epoch < self.config.train.epochs

    def train_epoch(self) -> None:
        """Train on this rank's slices of the epoch's global batches, from the saved position,
        until the epoch ends or the run is done."""
        state = self.state
        start = DataPosition.from_dict(state.position or {"epoch": state.epoch})
        slices = self.stream.epoch(start)
        # Per optimizer step (summed over its micro-batches): seconds waiting for batches,
        # seconds computing, real tokens. Plain numbers and tensors: no host/device sync.
        waited, computed, real_tokens = 0.0, 0.0, 0
        for (batch, position), wait in _timed(_collated(slices, self.collate, self.device)):
            # Every rank takes a slice of the same global batches; the check keeps a rank
            # whose request failed from leaving the others waiting in a gather.
            if not distributed.all_ranks(batch is not None):
                break
            state.position = position.as_dict()
            waited += wait
            started = time.perf_counter()
            if self.teacher is not None:
                batch["teacher_vectors"] = self.teacher(batch, self.engine.autocast)
            micro = state.batches_in_epoch % self.accumulation
            last_micro = micro == self.accumulation - 1
            metrics = self.step_fn(self.engine, batch, self.weights, sync=last_micro)
            self._count_batch(batch)
            real_tokens = real_tokens + batch["num_real_tokens"]
            if not last_micro:
                computed += time.perf_counter() - started
                continue
            self.engine.step()
            computed += time.perf_counter() - started
            self._optimizer_step_done(metrics, computed, real_tokens, waited)
            waited, computed, real_tokens = 0.0, 0.0, 0
            if state.step == self.total_steps:
                break
        if state.step < self.total_steps:
            state.epoch += 1
            state.batches_in_epoch = 0
            state.position = DataPosition(epoch=state.epoch).as_dict()

    def _count_batch(self, batch: dict) -> None:
        """Record a trained micro-batch: its rows (output.row_log) and truncations."""
        self.state.batches_in_epoch += 1
        if self.row_log is not None:
            self.row_log.write(self.state, batch["row_ids"].cpu().numpy())
        self.truncated_since_report += batch["num_truncated"]

    def _optimizer_step_done(self, metrics, computed: float, real_tokens, waited: float) -> None:
        """Count the step, log it, and evaluate/report when it is due."""
        state, train = self.state, self.config.train
        state.step += 1
        sentences = train.global_batch * self.accumulation
        state.sentences_seen += sentences
        self.progress.record(
            metrics, self.engine.lr, sentences, computed, real_tokens * self.world, waited
        )
        last = state.step == self.total_steps
        report_every = train.report_steps or self.config.eval.eval_steps
        if state.step % self.config.eval.eval_steps == 0 or last:
            self.evaluate_and_report(final=last)
        elif state.step % report_every == 0:
            self.evaluate_and_report()

    def evaluate_and_report(self, final: bool = False) -> None:
        """Score STS-B dev and the retrieval splits (every rank embeds a share), report the
        metrics, the selection score among them, and a checkpoint (every rank)."""
        state, rank = self.state, self.rank
        # The training window closes here and reopens after the checkpoint: evaluation and
        # checkpoint writing are not training throughput.
        window = self.progress.window_means()
        state.truncated += int(distributed.all_reduce_sum(self.truncated_since_report))
        self.truncated_since_report = torch.zeros_like(self.truncated_since_report)
        # Every rank embeds its share of the dev sentences; rank 0's scores are the ones
        # reported (all ranks compute the same; the broadcast makes that exact).
        scores = distributed.broadcast_object(
            _dev_scores(
                self.encoder,
                self.tokenizer,
                self.config.model,
                self.config.eval,
                self.retrieval,
                self.documents,
            )
        )
        selected = selected_metric(self.config.eval.select_by)
        metrics = {
            **scores,
            SELECT_METRIC: scores[selected],
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
        self.progress.print_eval(state.step, scores[DEV_METRIC], metrics)
        _report(self.engine, state, metrics, self.config_dict, rank)
        self.progress.restart_clock()

    def finish(self) -> None:
        """Refuse a run that trained nothing; make the last step's report the final one."""
        state = self.state
        if state.step == 0:
            rows = self.config.train.global_batch * self.accumulation
            raise ValueError(
                f"the corpus gave no full step: fewer than the global batch × "
                f"gradient_accumulation_steps = {rows} rows; use a larger corpus or a smaller "
                "batch"
            )
        if state.history and state.history[-1].get("step") != state.step:
            # The epochs ran out before total_steps: the last step is final.
            if self.rank == 0:
                log.warning(
                    "the corpus ended after %d of %d planned steps", state.step, self.total_steps
                )
            self.evaluate_and_report(final=True)
        self.progress.close()


def _collator(
    model: ModelConfig, data: DataConfig, loss: LossConfig, tokenizer, seed: int
) -> ContrastiveCollator:
    return ContrastiveCollator(
        tokenizer,
        model.max_seq_length,
        kind=data.kind,
        text_column=data.text_column,
        anchor_column=data.anchor_column,
        positive_column=data.positive_column,
        negative_column=data.negative_column,
        group_column=data.group_column,
        mlm_probability=loss.mlm_probability if loss.mlm_weight > 0 else None,
        seed=seed,
    )


def worker_threads(train: TrainLoopConfig) -> int:
    """Torch threads per worker: `train.torch_threads`, else the worker's CPUs rounded up
    (2.5 CPUs → 3 threads; Python's round() would give 2: it rounds halves to even)."""
    return train.torch_threads or max(1, math.ceil(train.cpus_per_worker))


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


def _collated(slices: Iterable, collate, device: torch.device) -> Iterator[tuple]:
    """(training batch on the device, data position after it) for each slice, then (None,
    None) for as long as the caller asks: the epoch has ended."""
    for table, position in slices:
        batch = collate(numpy_batch(table))
        yield {key: value.to(device, non_blocking=True) for key, value in batch.items()}, position
    while True:
        yield None, None


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


def _step_function(train: TrainLoopConfig, world: int):
    """GradCache when `train.mini_batch_size` is below this group's largest slice (⌈G/W⌉
    rows: the same on every rank, so every rank takes the same step, as ZeRO needs)."""
    begin, end = split_rows(train.global_batch, world, 0)
    if train.mini_batch_size is not None and train.mini_batch_size < end - begin:
        return lambda engine, batch, weights, sync: cached_step(
            engine, batch, weights, train.mini_batch_size, sync
        )
    return plain_step


def retrieval_splits(e: EvalConfig, documents: bool = False) -> list[RetrievalSplit]:
    """The splits of eval.retrieval_dir (`documents`: of eval.documents_dir) every evaluation
    scores (selection.scored_splits; none without a directory). A directory on object
    storage (the held-out documents of an InfoCSE run on a cluster) is copied to this node
    once."""
    directory = e.documents_dir if documents else e.retrieval_dir
    if directory is None:
        return []
    directory = storage.local_model_dir(directory)
    return read_splits(directory, scored_splits(list_splits(directory), e.select_by, documents))


def _dev_scores(
    encoder: TrainableEncoder,
    tokenizer,
    model: ModelConfig,
    e: EvalConfig,
    retrieval: list[RetrievalSplit],
    documents: list[RetrievalSplit] = (),
) -> dict[str, float]:
    """STS-B dev Spearman and nDCG@10 of each retrieval split and document split (× 100) of
    the module being trained, embedded as its export will embed (passages of documents at
    eval.documents_max_seq_length, not at the training length). Called on every rank: each
    embeds 1/W of the texts (distributed.map_sharded), so evaluation takes 1/W of the time it
    took when rank 0 alone embedded them all; every rank makes the same encode calls, as the
    gathers need."""
    include_mlp = model.mlp_head == "export"

    def encoder_at(max_seq_length: int):
        def embed(sentences: list[str]) -> np.ndarray:
            return embed_module(
                encoder, tokenizer, sentences, max_seq_length, e.batch_size, include_mlp
            )

        return lambda sentences: distributed.map_sharded(sentences, embed, order_key=len)

    encode = encoder_at(model.max_seq_length)
    scores = {DEV_METRIC: stsb_score(encode, "dev", e.senteval_dir, e.max_pairs)}
    if retrieval:  # one pass over the corpus for every split (beir.score_splits)
        for split, result in score_splits(encode, retrieval).items():
            scores[retrieval_metric(split)] = result["metrics"]["ndcg@10"]
    if documents:
        limit = config_position_limit(encoder.backbone.config) or e.documents_max_seq_length
        long_encode = encoder_at(min(e.documents_max_seq_length, limit))
        for split, result in score_splits(long_encode, documents).items():
            scores[documents_metric(split)] = result["metrics"]["ndcg@10"]
    return scores


def _report(engine, state: LoopState, metrics: dict, config_dict: dict, rank: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        if rank == 0 or engine.saves_on_every_rank:
            engine.save(directory)
        # Every rank adds its own RNG file; Ray merges the ranks' files into one checkpoint.
        # The data position is in the loop state: the same on every rank.
        save_loop_state(directory, state, config_dict, rank)
        checkpoint = ray.train.Checkpoint.from_directory(directory)
        ray.train.report(metrics, checkpoint=checkpoint)
