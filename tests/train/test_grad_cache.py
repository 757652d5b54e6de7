"""GradCache (cached_step) computes the plain step's loss and gradients, dropout included.

A dropout mask is drawn per forward call, so "same seeds" means: the plain step's math
(forward_objective) with its forward run over the same mini-batches from the same RNG state
(`MiniBatchForward` below, graph kept). With one mini-batch, or dropout off, the reference is
plain_step itself. Everything runs in float64 on a tiny BERT with dropout 0.1.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from distributed_emb.data.epoch_plan import split_rows
from distributed_emb.losses.loss_config import LossConfig
from distributed_emb.train.grad_cache import (
    RandContext,
    cached_step,
    forward_mini_batch,
    split_mini_batches,
)
from distributed_emb.train.step import forward_objective, plain_step
from distributed_emb.train.train_config import DeepSpeedConfig, TrainLoopConfig

SENTENCES = [
    "A man is playing a guitar on the street.",
    "The cat sleeps.",
    "Stocks fell sharply today after the report on inflation.",
    "She is reading a long novel by the window.",
    "Rain is expected tomorrow.",
    "Two dogs run in a park near the river.",
    "He cooked pasta for dinner.",
    "The train was late again this morning, as it is every Monday.",
]
POSITIVES = [
    "Someone plays an instrument.",
    "A kitten naps on a couch in the afternoon sun.",
    "Markets dropped a lot.",
    "A woman reads a book.",
    "It will rain on the next day, say the forecasts.",
    "Dogs are running outside.",
    "Dinner was pasta he made himself.",
    "Again the train came late.",
]
GROUPS = ["d1", "d1", "d2", "d3", "d4", "d4", "d5", "d6"]
WITH_MLM = LossConfig(
    temperature=0.05, reconstruction_weight=0.5, reconstruction_form="squared_norm", mlm_weight=0.3
)
NO_MLM = LossConfig(temperature=0.05, reconstruction_weight=0.5)
TIGHT = {"rtol": 1e-9, "atol": 1e-12}
UNEVEN_ROWS = 7  # a global batch two workers split 4 + 3


# The engine's knobs for these checks: no clipping, a large step (the real TrainLoopConfig).
TRAIN = TrainLoopConfig(max_grad_norm=None, learning_rate=1e-3)


@functools.cache
def _tokenizer(model_path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def make_batch(model_path: str, kind: str, rows: slice = slice(None), mlm: bool = True):
    from distributed_emb.data.collate import ContrastiveCollator

    collate = ContrastiveCollator(
        _tokenizer(model_path),
        32,
        kind=kind,
        text_column="text",
        group_column="doc" if kind == "pairs" else None,
        mlm_probability=0.3 if mlm else None,
        seed=0,
    )
    columns = {"text": SENTENCES[rows]} if kind == "sentences" else {}
    if kind == "pairs":
        columns = {"anchor": SENTENCES[rows], "positive": POSITIVES[rows], "doc": GROUPS[rows]}
    return collate({k: np.array(v) for k, v in columns.items()})


def make_engine(model_path: str, weights: LossConfig, train: bool):
    from distributed_emb.model.encoder import TrainableEncoder
    from distributed_emb.train.engine import DDPEngine

    torch.manual_seed(0)  # same MLP-head init in every process
    encoder = TrainableEncoder(
        model_path, pooler="mean", mlp_head=True, with_mlm_head=weights.mlm_weight > 0
    ).double()
    encoder.train(train)
    return DDPEngine(encoder, TRAIN, total_steps=1, device=torch.device("cpu"))


class MiniBatchForward:
    """The encoder's forward over the cached step's mini-batches, one call each, graph kept,
    reassembled into the full-batch outputs: the plain step with the cached step's masks."""

    def __init__(self, forward_module, mini_batch_size: int):
        self.forward_module = forward_module
        self.mini_batch_size = mini_batch_size

    def __call__(self, input_ids, attention_mask, mlm_input_ids=None, mlm_attention_mask=None):
        use_mlm = mlm_input_ids is not None
        batch = {"input_ids": input_ids, "attention_mask": attention_mask}
        if use_mlm:  # labels only steer the split's padding cut; the loss gets the real ones
            batch.update(
                mlm_input_ids=mlm_input_ids,
                mlm_attention_mask=mlm_attention_mask,
                mlm_labels=torch.zeros_like(mlm_input_ids),
            )
        view1, view2, all_logits = [], [], []
        for mini in split_mini_batches(batch, self.mini_batch_size, use_mlm):
            z, logits = forward_mini_batch(self.forward_module, mini, use_mlm)
            z1, z2 = z.chunk(2)
            view1.append(z1)
            view2.append(z2)
            if use_mlm:  # (m, L_j, V) → (m, L, V); the cut columns are unmasked (label −100)
                all_logits.append(F.pad(logits, (0, 0, 0, input_ids.shape[1] - logits.shape[1])))
        z = torch.cat(view1 + view2)  # (2B, d)
        return (z, torch.cat(all_logits)) if use_mlm else z


class MiniBatchEngine:
    """The engine with the reference forward, for plain_step."""

    def __init__(self, engine, mini_batch_size: int):
        self.engine = engine
        self.forward_module = MiniBatchForward(engine.forward_module, mini_batch_size)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def gradients(module) -> dict[str, torch.Tensor]:
    grads = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
    module.zero_grad(set_to_none=True)
    return grads


def assert_same_gradients(got: dict, expected: dict, **tolerance) -> None:
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.allclose(got[name], value, **tolerance), (
            name,
            float((got[name] - value).abs().max()),
            float(value.abs().max()),
        )


def assert_same_metrics(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for key in expected:
        assert torch.allclose(got[key], expected[key], **TIGHT), (key, got[key], expected[key])


def run_both(engine, reference_engine, batch, weights, mini_batch_size, seed=0, **cached_kw):
    """(reference metrics, reference grads, cached metrics, cached grads, RNG states after)."""
    torch.manual_seed(seed)
    reference = plain_step(reference_engine, batch, weights, sync=True)
    reference_grads, reference_rng = gradients(engine.module), torch.get_rng_state()
    torch.manual_seed(seed)
    cached = cached_step(engine, batch, weights, mini_batch_size, sync=True, **cached_kw)
    cached_grads, cached_rng = gradients(engine.module), torch.get_rng_state()
    return reference, reference_grads, cached, cached_grads, (reference_rng, cached_rng)


# --- single process -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sentences", "pairs"])
@pytest.mark.parametrize("mini_batch_size", [1, 3, 8])
def test_without_dropout_equals_plain_step(tiny_bert_path, kind, mini_batch_size):
    engine = make_engine(tiny_bert_path, WITH_MLM, train=False)
    batch = make_batch(tiny_bert_path, kind)
    reference, expected, cached, got, _ = run_both(engine, engine, batch, WITH_MLM, mini_batch_size)
    assert set(cached) == {"loss", "loss_contrastive", "loss_reconstruction", "loss_mlm"}
    assert_same_metrics(cached, reference)
    assert_same_gradients(got, expected, **TIGHT)


@pytest.mark.parametrize("mini_batch_size", [8, 20])
def test_one_mini_batch_with_dropout_equals_plain_step(tiny_bert_path, mini_batch_size):
    engine = make_engine(tiny_bert_path, WITH_MLM, train=True)
    batch = make_batch(tiny_bert_path, "sentences")
    reference, expected, cached, got, (rng_a, rng_b) = run_both(
        engine, engine, batch, WITH_MLM, mini_batch_size
    )
    assert_same_metrics(cached, reference)
    assert_same_gradients(got, expected, **TIGHT)
    assert torch.equal(rng_a, rng_b)  # the step leaves the random stream where plain_step does


@pytest.mark.parametrize("mini_batch_size", [1, 3, 5])  # 3, 5: B = 8 splits unevenly
@pytest.mark.parametrize("weights", [WITH_MLM, NO_MLM], ids=["mlm", "no_mlm"])
def test_with_dropout_equals_plain_step_on_same_masks(tiny_bert_path, mini_batch_size, weights):
    engine = make_engine(tiny_bert_path, weights, train=True)
    batch = make_batch(tiny_bert_path, "sentences", mlm=weights.mlm_weight > 0)
    reference_engine = MiniBatchEngine(engine, mini_batch_size)
    reference, expected, cached, got, (rng_a, rng_b) = run_both(
        engine, reference_engine, batch, weights, mini_batch_size
    )
    assert_same_metrics(cached, reference)
    assert_same_gradients(got, expected, **TIGHT)
    assert torch.equal(rng_a, rng_b)
    # Dropout really is on: another seed gives another loss.
    torch.manual_seed(1)
    other = cached_step(engine, batch, weights, mini_batch_size, sync=True)
    engine.module.zero_grad(set_to_none=True)
    assert not torch.allclose(other["loss"], cached["loss"])


def test_gradients_are_wrong_without_rng_replay(tiny_bert_path):
    engine = make_engine(tiny_bert_path, WITH_MLM, train=True)
    batch = make_batch(tiny_bert_path, "sentences")
    reference, expected, cached, got, _ = run_both(
        engine, MiniBatchEngine(engine, 3), batch, WITH_MLM, 3, replay_rng=False
    )
    # The loss comes from the first pass and is right; the re-run drew other dropout masks.
    assert torch.allclose(cached["loss_contrastive"], reference["loss_contrastive"], **TIGHT)
    differences = [
        float((got[n] - e).abs().max() / e.abs().max().clamp(min=1e-30))
        for n, e in expected.items()
    ]
    assert max(differences) > 1e-3


def test_rand_context_replays_and_restores_the_stream():
    torch.manual_seed(3)
    recorded = RandContext(torch.zeros(1))
    first = torch.rand(5)
    after_first = torch.get_rng_state()
    with recorded:
        replayed = torch.rand(5)
    assert torch.equal(first, replayed)
    assert torch.equal(torch.get_rng_state(), after_first)


def test_split_keeps_both_views_together_and_cuts_padding(tiny_bert_path):
    batch = make_batch(tiny_bert_path, "pairs")
    minis = split_mini_batches(batch, 3, use_mlm=True)
    assert [m["input_ids"].shape[0] for m in minis] == [6, 6, 4]
    assert [m["mlm_input_ids"].shape[0] for m in minis] == [3, 3, 2]
    b = len(SENTENCES)
    second = minis[1]
    length = second["input_ids"].shape[1]
    assert torch.equal(second["input_ids"][:3], batch["input_ids"][3:6, :length])  # anchors
    assert torch.equal(second["input_ids"][3:], batch["input_ids"][b + 3 : b + 6, :length])
    assert bool(second["attention_mask"][:, -1].any())  # no all-padding column left
    assert (batch["attention_mask"][[3, 4, 5, b + 3, b + 4, b + 5], length:] == 0).all()
    with pytest.raises(ValueError, match="mini_batch_size"):
        split_mini_batches(batch, 0, use_mlm=False)
    with pytest.raises(ValueError, match="2B"):
        split_mini_batches({k: batch[k][:-1] for k in ("input_ids", "attention_mask")}, 2, False)


# --- two gloo workers under DDP, gathered negatives --------------------------------------


def _sum_gradients_over_ranks(grads: dict) -> dict:
    """In place: what DDP's all-reduce sums before it divides by the world size."""
    for value in grads.values():
        dist.all_reduce(value)
    return grads


def _average_over_ranks(local: dict) -> dict:
    """What DDP leaves after the backward of each rank's `local` gradients."""
    summed = _sum_gradients_over_ranks({n: g.clone() for n, g in local.items()})
    return {n: g / dist.get_world_size() for n, g in summed.items()}


class AllReduceCounter:
    """DDP comm hook: all-reduces as usual, counting the buckets reduced since the last pop."""

    def __init__(self, ddp_module):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        self.count = 0

        def hook(state, bucket):
            self.count += 1
            return allreduce_hook(state, bucket)

        ddp_module.register_comm_hook(None, hook)

    def pop(self) -> int:
        count, self.count = self.count, 0
        return count


def _worker(rank: int, world: int, init_file: str, model_path: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    per_rank = len(SENTENCES) // world
    rows = slice(rank * per_rank, (rank + 1) * per_rank)
    results = {}

    # Dropout on, λ > 0, β > 0, same-document masking: each rank compares in-process.
    engine = make_engine(model_path, WITH_MLM, train=True)
    all_reduces = AllReduceCounter(engine.forward_module)
    batch = make_batch(model_path, "pairs", rows)
    for m in (1, 3):
        seed = 100 + rank  # each rank its own masks, as in training
        # Reference: the plain math through the raw module (no DDP), then the DDP average.
        torch.manual_seed(seed)
        loss, metrics = forward_objective(MiniBatchForward(engine.module, m), batch, WITH_MLM)
        loss.backward()
        local = gradients(engine.module)
        averaged = _average_over_ranks(local)
        torch.manual_seed(seed)
        synced = cached_step(engine, batch, WITH_MLM, m, sync=True)
        results[f"synced{m}"] = (
            synced["loss"],
            metrics["loss"],
            gradients(engine.module),
            averaged,
        )
        results[f"buckets_synced{m}"] = all_reduces.pop()
        torch.manual_seed(seed)
        cached_step(engine, batch, WITH_MLM, m, sync=False)  # accumulation: no all-reduce
        results[f"local{m}"] = (gradients(engine.module), local)
        results[f"buckets_local{m}"] = all_reduces.pop()
    plain_step(engine, batch, WITH_MLM, sync=True)
    results["buckets_plain"] = all_reduces.pop()

    # Dropout off, β = 0: the cached 2-worker step equals one process on all 8 rows.
    engine = make_engine(model_path, NO_MLM, train=False)
    metrics = cached_step(engine, make_batch(model_path, "pairs", rows, mlm=False), NO_MLM, 3, True)
    results["global"] = (metrics["loss"], gradients(engine.module))

    # Unequal slices, 4 and 3 of 7 rows (split_rows): the same, with each rank's loss weighted;
    # with m = 1 or 3 the short rank makes up the mini-batch count with a filler.
    start, stop = split_rows(UNEVEN_ROWS, world, rank)
    batch = make_batch(model_path, "pairs", slice(start, stop), mlm=False)
    for m in (1, 3):
        metrics = cached_step(engine, batch, NO_MLM, m, sync=True)
        results[f"uneven{m}"] = (metrics["loss"], gradients(engine.module))
    # β > 0 (no exact one-process form: see step.rank_weight): cached == the plain weighted step.
    engine = make_engine(model_path, WITH_MLM, train=False)
    batch = make_batch(model_path, "pairs", slice(start, stop))
    loss, metrics = forward_objective(engine.module, batch, WITH_MLM)
    loss.backward()
    averaged = _average_over_ranks(gradients(engine.module))
    cached = cached_step(engine, batch, WITH_MLM, 1, sync=True)
    results["uneven_mlm"] = (cached["loss"], metrics["loss"], gradients(engine.module), averaged)
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_workers_cached_equals_plain_with_gathered_negatives(tiny_bert_path, tmp_path):
    mp.spawn(
        _worker,
        args=(2, str(tmp_path / "init"), tiny_bert_path, str(tmp_path)),
        nprocs=2,
        join=True,
    )
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for results in ranks:
        for m in (1, 3):
            cached_loss, reference_loss, synced, averaged = results[f"synced{m}"]
            assert torch.allclose(cached_loss, reference_loss, **TIGHT)
            assert_same_gradients(synced, averaged, **TIGHT)
            got_local, expected_local = results[f"local{m}"]
            assert_same_gradients(got_local, expected_local, **TIGHT)
        # DDP all-reduces once per step (the last mini-batch), and not at all without sync.
        assert results["buckets_plain"] > 0
        assert results["buckets_synced1"] == results["buckets_synced3"] == results["buckets_plain"]
        assert results["buckets_local1"] == results["buckets_local3"] == 0
    # Synced gradients are the same on both ranks; local ones differ (different rows).
    assert_same_gradients(ranks[0]["synced3"][2], ranks[1]["synced3"][2], **TIGHT)
    name = "backbone.embeddings.word_embeddings.weight"
    assert not torch.allclose(ranks[0]["local3"][0][name], ranks[1]["local3"][0][name])

    engine = make_engine(tiny_bert_path, NO_MLM, train=False)
    # Every rank reports the global mean and holds the one-process gradients, for 8 rows split
    # evenly and for 7 split 4 + 3.
    for rows, keys in ((slice(None), ["global"]), (slice(UNEVEN_ROWS), ["uneven1", "uneven3"])):
        batch = make_batch(tiny_bert_path, "pairs", rows, mlm=False)
        reference = plain_step(engine, batch, NO_MLM, True)
        expected = gradients(engine.module)
        for results in ranks:
            for key in keys:
                loss, grads = results[key]
                assert torch.allclose(loss, reference["loss"], **TIGHT), key
                assert_same_gradients(grads, expected, **TIGHT)
    for results in ranks:
        cached_loss, reference_loss, synced, averaged = results["uneven_mlm"]
        assert torch.allclose(cached_loss, reference_loss, **TIGHT)
        assert_same_gradients(synced, averaged, **TIGHT)


# --- two gloo workers under DeepSpeed ZeRO -------------------------------------------------


def _deepspeed_worker(rank, world, init_file, port, model_path, stages, out_dir) -> None:
    """Two loop micro-batches of 3 pairs each (gradient accumulation 2), split 2 + 1 over the
    ranks (split_rows), mini-batches of 1: rank 1 makes up its second mini-batch with a filler,
    without which the ranks' collectives would not pair up."""
    import copy

    from deepspeed.utils import safe_get_full_grad

    from distributed_emb.model.encoder import TrainableEncoder
    from distributed_emb.train.deepspeed_engine import DeepSpeedEngine

    torch.set_num_threads(1)
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    start, stop = split_rows(3, world, rank)
    batches = [make_batch(model_path, "pairs", slice(3 * i + start, 3 * i + stop)) for i in (0, 1)]
    results = {}
    for stage in stages:
        torch.manual_seed(0)
        encoder = TrainableEncoder(model_path, pooler="mean", mlp_head=True, with_mlm_head=True)
        encoder.train()
        # Reference: plain math on a copy, micro-batches averaged, then averaged over ranks.
        reference = copy.deepcopy(encoder)
        for index, batch in enumerate(batches):
            torch.manual_seed(100 + 10 * rank + index)
            loss, _ = forward_objective(MiniBatchForward(reference, 1), batch, WITH_MLM)
            (loss / len(batches)).backward()
        expected = _sum_gradients_over_ranks(gradients(reference))
        expected = {n: g / world for n, g in expected.items()}

        config = dataclasses.replace(
            TRAIN,
            engine="deepspeed",
            batch_size=2,
            gradient_accumulation_steps=2,
            deepspeed=DeepSpeedConfig(zero_stage=stage),
        )
        engine = DeepSpeedEngine(encoder, config, total_steps=1, device=torch.device("cpu"))
        for index, batch in enumerate(batches):  # what train_loop_per_worker does
            torch.manual_seed(100 + 10 * rank + index)
            cached_step(engine, batch, WITH_MLM, 1, sync=index == len(batches) - 1)
        got = {n: safe_get_full_grad(p) for n, p in engine.engine.module.named_parameters()}
        engine.step()
        results[stage] = (
            {n: got[n].clone() for n in expected},
            expected,
            engine.engine.global_steps,
        )
    torch.save(results, os.path.join(out_dir, f"deepspeed_rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.slow
def test_deepspeed_zero_cached_step_with_accumulation_equals_plain(tiny_bert_path, tmp_path):
    """ZeRO-2 partitions gradients during backward, ZeRO-3 also the parameters; both must add
    the mini-batches' backward calls into one accumulated micro-batch, with unequal slices too."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    stages = (2, 3)
    mp.spawn(
        _deepspeed_worker,
        args=(2, str(tmp_path / "init"), port, tiny_bert_path, stages, str(tmp_path)),
        nprocs=2,
        join=True,
    )
    for rank in range(2):
        results = torch.load(tmp_path / f"deepspeed_rank{rank}.pt")
        for stage in stages:
            got, expected, optimizer_steps = results[stage]
            assert optimizer_steps == 1
            # fp32 (DeepSpeed's supported dtype): tolerance relative to the largest gradient.
            scale = max(float(e.abs().max()) for e in expected.values())
            assert_same_gradients(got, expected, rtol=0.0, atol=1e-5 * scale)
