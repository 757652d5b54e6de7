"""Sections 1 and 2: the training step on one worker (the project's Ray Train run against a
bare PyTorch loop and sentence-transformers' SimCSE recipe, interleaved), and its model FLOPs
against a dense matmul measured in the same run."""

from __future__ import annotations

import random

import torch
from transformers import AutoConfig, AutoTokenizer

from bench.baselines import BareLoop, SentenceTransformersRecipe
from bench.context import BenchContext
from bench.flops import matmul_flops_per_s, training_flops_per_token
from bench.project_runs import ProjectRun
from bench.report import median, percent, ratio
from distributed_emb.config import TrainingConfig

PROJECT = "project: Ray Train worker, InforMin-CL"
PROJECT_GROUPED = "project, length-grouped batches (data.length_group_batches=16)"
BARE = "bare PyTorch loop, same math"
ST = "sentence-transformers SimCSE recipe (MNRL)"
BARE_GROUPED = "bare loop, length-grouped batches"


def one_worker_config(bench: BenchContext) -> TrainingConfig:
    """The project contender's config; sections 4 and 6 report runs of it too."""
    return bench.project_config(1, bench.args.threads)


def run(bench: BenchContext) -> list[ProjectRun]:
    """Fills tables 1 and 2; returns the project's one-worker runs (one per round)."""
    a = bench.args
    config = one_worker_config(bench)
    grouped_config = bench.project_config(1, a.threads, extra=["data.length_group_batches=16"])
    batches = bench.batches(a.warmup + a.steps)
    # The timed batches regrouped among themselves: the same sentences, less padding.
    tokenizer = AutoTokenizer.from_pretrained(bench.model)
    grouped = batches[: a.warmup] + length_grouped(batches[a.warmup :], tokenizer, a.seq)
    total = (a.warmup + a.steps) * a.rounds
    torch.set_num_threads(a.threads)
    loss = config.loss
    bare = BareLoop(
        bench.model,
        a.seq,
        config.train.learning_rate,
        loss.temperature,
        loss.reconstruction_weight,
        total_steps=2 * total,
    )
    st = SentenceTransformersRecipe(
        bench.model, a.seq, config.train.learning_rate, loss.temperature, total_steps=total
    )
    matmul = [matmul_flops_per_s(a.threads)]
    contenders = {
        PROJECT: lambda: bench.run_project(config),
        PROJECT_GROUPED: lambda: bench.run_project(grouped_config),
        BARE: lambda: bare.run(batches, a.warmup),
        ST: lambda: st.run(batches, a.warmup),
        BARE_GROUPED: lambda: bare.run(grouped, a.warmup),
    }
    runs: dict[str, list] = {name: [] for name in contenders}
    names = list(contenders)
    orders = []
    for round_index in range(a.rounds):
        # A fresh order each round (seeded): a fixed rotation would always put the same
        # contender right after a Ray run, while Ray's processes are still winding down.
        order = random.Random(round_index).sample(names, len(names))
        orders.append(order)
        for name in order:
            print(f"[bench]   round {round_index + 1}/{a.rounds}: {name}", flush=True)
            runs[name].append(contenders[name]())
        matmul.append(matmul_flops_per_s(a.threads))
    torch.set_num_threads(a.threads)
    bench.results["raw"]["step"] = {k: [vars(r) for r in v] for k, v in runs.items()}
    bench.results["raw"]["step_orders"] = orders
    bench.results["raw"]["matmul_flops_per_s"] = matmul
    _step_table(bench, runs)
    _hardware_table(bench, runs, matmul)
    return runs[PROJECT]


def _step_table(bench: BenchContext, runs: dict[str, list]) -> None:
    a = bench.args

    def sps(name: str, r: int) -> float:
        return runs[name][r].sentences_per_s

    def paired(numerator: str, denominator: str) -> float:
        return median([sps(numerator, r) / sps(denominator, r) for r in range(a.rounds)])

    step = bench.table(
        "training_step",
        f"1. Training step, one worker (batch {a.batch}, max length {a.seq}, {a.threads} "
        f"torch thread(s) each; median of {a.rounds} interleaved rounds × {a.steps} steps)",
        [
            "contender",
            "sentences/s",
            "tokens/s",
            "× bare loop",
            "× sentence-transformers",
            "padding",
            "data wait",
        ],
    )
    for name, rs in runs.items():
        # The project's runs do not record padding; only they record data waits.
        padded = [getattr(r, "padded_tokens", None) for r in rs]
        padding = 1 - sum(r.real_tokens for r in rs) / sum(padded) if all(padded) else None
        wait = (
            median([r.data_wait_fraction for r in rs])
            if name in (PROJECT, PROJECT_GROUPED)
            else None
        )
        step.add(
            name,
            median([r.sentences_per_s for r in rs]),
            median([r.tokens_per_s for r in rs]),
            ratio(paired(name, BARE)),
            ratio(paired(name, ST)),
            percent(padding),
            percent(wait),
        )
    step.notes.append(
        "Ratios are medians of per-round ratios (each round runs every contender back to "
        "back). tokens/s counts real tokens of both views, padding excluded. The project "
        "row is the loop's own steady-state windows (evaluation and checkpoints excluded; "
        "data waits, tokenisation and Ray included); its padding is not recorded by the "
        "loop (same corpus and batch shape as the bare loop)."
    )


def _hardware_table(bench: BenchContext, runs: dict[str, list], matmul: list[float]) -> None:
    a = bench.args
    model_config = AutoConfig.from_pretrained(bench.model)
    ceiling = max(matmul)
    hardware = bench.table(
        "hardware",
        f"2. Hardware ceiling: model FLOPs utilisation against fp32 dense matmul "
        f"({a.threads} thread(s), measured in this run: "
        f"{ceiling / 1e9:.1f} GFLOP/s)",
        ["contender", "model GFLOP/s", "matmul GFLOP/s", "MFU"],
    )
    for name, rs in runs.items():
        achieved = []
        for r in rs:
            # Mean real length of a sequence: attention FLOPs grow with it.
            length = r.tokens_per_s / (2 * r.sentences_per_s)
            per_token = training_flops_per_token(
                model_config.hidden_size,
                model_config.num_hidden_layers,
                model_config.intermediate_size,
                length,
            )
            achieved.append(r.tokens_per_s * per_token)
        flops = median(achieved)
        hardware.add(name, flops / 1e9, ceiling / 1e9, percent(flops / ceiling))
    hardware.notes.append(
        "Model FLOPs = 3 × forward matmul FLOPs of the real tokens (bench/flops.py, checked "
        "against torch.utils.flop_counter in tests/bench); padding counts as waste. The "
        "matmul rate is the best 1024² fp32 product over one second, measured at the start "
        "of the section and after each round "
        f"({', '.join(f'{m / 1e9:.1f}' for m in matmul)} GFLOP/s)."
    )


def length_grouped(
    batches: list[list[str]], tokenizer, max_length: int, seed: int = 0
) -> list[list[str]]:
    """The same sentences re-batched so each batch holds similar lengths (sorted, cut into
    batches of the same size, batch order shuffled): what length grouping would save."""
    texts = [t for batch in batches for t in batch]
    lengths = [min(len(ids), max_length) for ids in tokenizer(texts)["input_ids"]]
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    size = len(batches[0])
    grouped = [[texts[i] for i in order[s : s + size]] for s in range(0, len(order), size)]
    random.Random(seed).shuffle(grouped)
    return grouped
