"""Section 7: where a training step's time goes (the project's step under torch.profiler), and
the speed changes A/B'd step by step in one process.

    python -m bench.section_profile profile [--model DIR] [--batch 32] [--seq 32] [--threads 1]
    python -m bench.section_profile ab --variants default,compiled --steps 16   # compile A/B alone

Profile (tables 7a and 7b; `profile` prints them on its own): what each Ray Train worker runs per
step, in this process (no Ray, so the profile holds only the step itself): the worker's collator
on real corpus sentences, `plain_step` (one forward of 2B rows, the InforMin-CL objective,
backward) and `engine.step()` (clipping, AdamW, schedule). The phases and the top operators by
self CPU time.

A/B (table 7c; `ab` prints one JSON line per variant): on a shared machine the load drifts
within seconds, so comparing whole runs minutes apart cannot resolve a 5% change. Here every
variant holds its own copy of the model and engine and the variants take turns step by step
over the same pool of sentences; each variant's speed is its real tokens over its own summed
step time. The step is the project's (collator, `plain_step`, `engine.step()`), as a Ray Train
worker runs it, minus Ray.

Variants:
- default: fp32, random batches, fused AdamW (the project's engine today);
- before: the same with `torch.optim.AdamW`'s default per-parameter update (the engine before
  the speed work);
- length-grouped: the same sentences batched by `length_groups` (data/epoch_plan.py;
  pool = all batches);
- bf16: `train.precision=bf16` autocast (losses stay fp32);
- compiled (not in table 7c, compiling takes minutes): `train.compile=true`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.context import BenchContext
from bench.report import percent, ratio

PHASES = ("collate", "forward+loss", "backward", "optimizer")


def profile_step(
    model_path: str, batches: list[list[str]], seq: int, threads: int, top: int = 10
) -> dict:
    """Profile `len(batches) - 1` steps after one warm-up step; phases and top operators."""
    import numpy as np
    import torch
    import transformers
    from torch.profiler import ProfilerActivity, profile, record_function
    from transformers import AutoTokenizer

    from distributed_emb.data.collate import ContrastiveCollator
    from distributed_emb.losses.loss_config import LossConfig
    from distributed_emb.model.encoder import TrainableEncoder
    from distributed_emb.train.engine import build_engine
    from distributed_emb.train.step import forward_objective
    from distributed_emb.train.train_config import TrainLoopConfig

    transformers.logging.set_verbosity_error()
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    encoder = TrainableEncoder(model_path, pooler="mean", mlp_head=True)
    encoder.train()
    train = TrainLoopConfig(batch_size=len(batches[0]))
    engine = build_engine(encoder, train, len(batches), torch.device("cpu"))
    weights = LossConfig(temperature=0.05, reconstruction_weight=0.1)
    collate = ContrastiveCollator(AutoTokenizer.from_pretrained(model_path), seq)

    def step(texts: list[str]) -> None:
        # plain_step's body, split so each phase is its own profiler range.
        with record_function("collate"):
            batch = collate({"text": np.array(texts, dtype=object)})
        with record_function("forward+loss"):
            loss, _ = forward_objective(engine.forward_module, batch, weights)
        with record_function("backward"):
            engine.backward(loss)
        with record_function("optimizer"):
            engine.step()

    step(batches[0])
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        for texts in batches[1:]:
            step(texts)
    torch.set_num_threads(previous)
    steps = len(batches) - 1
    events = profiler.key_averages()
    phase_ms = {e.key: e.cpu_time_total / 1000 / steps for e in events if e.key in PHASES}
    step_ms = sum(phase_ms.values())
    operators = sorted(
        (e for e in events if e.key not in PHASES and not e.key.startswith("ProfilerStep")),
        key=lambda e: e.self_cpu_time_total,
        reverse=True,
    )[:top]
    return {
        "steps": steps,
        "step_ms": step_ms,
        "phases": [
            {
                "phase": p,
                "ms_per_step": phase_ms.get(p, 0.0),
                "share": phase_ms.get(p, 0.0) / step_ms if step_ms else 0.0,
            }
            for p in PHASES
        ],
        "top_operators": [
            {
                "operator": e.key,
                "calls_per_step": e.count / steps,
                "self_ms_per_step": e.self_cpu_time_total / 1000 / steps,
                "share": e.self_cpu_time_total / 1000 / steps / step_ms if step_ms else 0.0,
            }
            for e in operators
        ],
    }


DEFAULT = "fp32, random batches, fused AdamW (default)"
BEFORE = "fp32, random batches, per-parameter AdamW (before)"
GROUPED = "fp32, length-grouped batches, fused AdamW (data.length_group_batches)"
BF16 = "bf16 autocast, random batches, fused AdamW (train.precision=bf16)"
COMPILED = "fp32, random batches, fused AdamW, compiled encoder (train.compile=true)"
VARIANTS = (DEFAULT, BEFORE, GROUPED, BF16)
SHORT_NAMES = {"default": DEFAULT, "before": BEFORE, "grouped": GROUPED, "bf16": BF16,
               "compiled": COMPILED}  # fmt: skip


def step_ab(
    model_path: str,
    batches: list[list[str]],
    seq: int,
    threads: int,
    variants: tuple[str, ...] = VARIANTS,
) -> dict:
    """One warm-up step per variant on `batches[0]`, then each of `batches[1:]` (regrouped by
    length for the grouped variant) with the variants taking turns. The compiled variant
    first meets every padded batch length it will be timed on, so no compiling is timed."""
    import numpy as np
    import torch
    import transformers
    from transformers import AutoTokenizer

    from distributed_emb.data.collate import ContrastiveCollator
    from distributed_emb.data.epoch_plan import length_groups
    from distributed_emb.losses.loss_config import LossConfig
    from distributed_emb.model.encoder import TrainableEncoder
    from distributed_emb.train.engine import build_engine
    from distributed_emb.train.optim import build_optimizer, build_scheduler
    from distributed_emb.train.step import plain_step
    from distributed_emb.train.train_config import TrainLoopConfig

    transformers.logging.set_verbosity_error()
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    collate = ContrastiveCollator(AutoTokenizer.from_pretrained(model_path), seq)
    size = len(batches[0])
    warm = collate({"text": np.array(batches[0], dtype=object)})
    plain = [collate({"text": np.array(t, dtype=object)}) for t in batches[1:]]
    pool = np.array([t for texts in batches[1:] for t in texts], dtype=object)
    # The product's grouping (data/epoch_plan.py), by characters as for untokenised text.
    order = np.random.default_rng(0).permutation(len(pool) // size)
    groups = length_groups(np.array([len(t) for t in pool]), size, order)
    grouped = [collate({"text": pool[rows]}) for rows in groups]
    inputs = {DEFAULT: plain, BEFORE: plain, GROUPED: grouped, BF16: plain, COMPILED: plain}
    weights = LossConfig(temperature=0.05, reconstruction_weight=0.1)

    engines = {}
    for name in variants:
        torch.manual_seed(0)
        encoder = TrainableEncoder(model_path, pooler="mean", mlp_head=True)
        encoder.train()
        warm_up = [warm]
        if name == COMPILED:
            encoder.compile_backbone()
            multiple = encoder.pad_to_multiple_of
            lengths = {-(-b["input_ids"].shape[1] // multiple): b for b in plain}  # one a shape
            warm_up = list(lengths.values())
        train = TrainLoopConfig(batch_size=size, precision="bf16" if name == BF16 else "fp32")
        engine = build_engine(encoder, train, 10_000, torch.device("cpu"))
        if name == BEFORE:
            engine.optimizer = build_optimizer(engine.module, train)  # not fused
            engine.scheduler = build_scheduler(engine.optimizer, 10_000, train)
        for batch in warm_up:
            plain_step(engine, batch, weights, sync=True)
            engine.step()
        engines[name] = engine

    seconds = {name: 0.0 for name in variants}
    tokens = {name: 0 for name in variants}
    padded = {name: 0 for name in variants}
    optimizer_seconds = {name: 0.0 for name in variants}
    for index in range(len(plain)):
        for name in variants[index % len(variants) :] + variants[: index % len(variants)]:
            batch, engine = inputs[name][index], engines[name]
            started = time.perf_counter()
            plain_step(engine, batch, weights, sync=True)
            stepped = time.perf_counter()
            engine.step()
            ended = time.perf_counter()
            seconds[name] += ended - started
            optimizer_seconds[name] += ended - stepped
            tokens[name] += int(batch["num_real_tokens"])
            padded[name] += batch["attention_mask"].numel()
    torch.set_num_threads(previous)
    steps = len(plain)
    return {
        name: {
            "ms_per_step": 1000 * seconds[name] / steps,
            "optimizer_ms_per_step": 1000 * optimizer_seconds[name] / steps,
            "tokens_per_s": tokens[name] / seconds[name],
            "padding": 1 - tokens[name] / padded[name],
            "steps": steps,
        }
        for name in variants
    }


def run(bench: BenchContext) -> None:
    """Fills tables 7a, 7b and 7c."""
    a = bench.args
    result = profile_step(bench.model, bench.batches(a.profile_steps + 1), a.seq, a.threads)
    bench.results["raw"]["profile"] = result
    phases = bench.table(
        "profile_phases",
        f"7a. Where a step's time goes (the project's step in one process, {a.threads} "
        f"thread(s), {result['step_ms']:.0f} ms per step under the profiler)",
        ["phase", "ms per step", "share"],
    )
    for row in result["phases"]:
        phases.add(row["phase"], row["ms_per_step"], percent(row["share"]))
    top = bench.table(
        "profile_operators",
        "7b. Top operators by self CPU time (torch.profiler)",
        ["operator", "calls per step", "self ms per step", "share of step"],
    )
    for row in result["top_operators"]:
        top.add(
            row["operator"],
            row["calls_per_step"],
            row["self_ms_per_step"],
            percent(row["share"]),
        )

    ab = step_ab(bench.model, bench.batches(a.ab_steps + 1), a.seq, a.threads)
    bench.results["raw"]["speed_ab"] = ab
    table = bench.table(
        "speed_ab",
        f"7c. The speed changes A/B, variants taking turns step by step in one process "
        f"({ab[DEFAULT]['steps']} steps each, {a.threads} thread(s))",
        [
            "variant",
            "ms per step",
            "optimizer ms",
            "real tokens/s",
            "× default",
            "× before",
            "padding",
        ],
    )
    for name in VARIANTS:
        row = ab[name]
        table.add(
            name,
            row["ms_per_step"],
            row["optimizer_ms_per_step"],
            row["tokens_per_s"],
            ratio(row["tokens_per_s"] / ab[DEFAULT]["tokens_per_s"]),
            ratio(row["tokens_per_s"] / ab[BEFORE]["tokens_per_s"]),
            percent(row["padding"]),
        )
    table.notes.append(
        "Speed = real tokens / summed step time (forward, loss, backward, clipping, "
        "optimizer); each variant has its own model and engine, the order rotates every "
        "step. The grouped variant trains on the same sentences, batched by "
        "data/epoch_plan.py's length grouping over the whole pool."
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Section 7 on its own: the step under torch.profiler, or the speed "
        "changes A/B'd step by step."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    profile = commands.add_parser(
        "profile",
        help="the step under torch.profiler (7a, 7b)",
        description="Where a training step's time goes: the project's step under torch.profiler.",
    )
    profile.add_argument("--model", default=None)
    profile.add_argument("--batch", type=int, default=32)
    profile.add_argument("--seq", type=int, default=32)
    profile.add_argument("--threads", type=int, default=1)
    profile.add_argument("--steps", type=int, default=3)
    ab = commands.add_parser(
        "ab",
        help="A/B the speed changes step by step (7c)",
        description="A/B the speed changes step by step.",
    )
    ab.add_argument("--variants", default="default,compiled", help=",".join(SHORT_NAMES))
    ab.add_argument("--steps", type=int, default=16)
    ab.add_argument("--batch", type=int, default=32)
    ab.add_argument("--seq", type=int, default=32)
    ab.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    if args.command == "profile":
        _print_profile(args)
    else:
        _print_ab(args)


def _print_profile(args: argparse.Namespace) -> None:
    from distributed_emb.paths import default_model_path, shipped_corpus

    lines = Path(shipped_corpus("wiki_sentences.txt")).read_text().splitlines()
    batches = [lines[i * args.batch : (i + 1) * args.batch] for i in range(args.steps + 1)]
    result = profile_step(args.model or default_model_path(), batches, args.seq, args.threads)
    print(json.dumps(result, indent=2))


def _print_ab(args: argparse.Namespace) -> None:
    from distributed_emb.paths import default_model_path, shipped_corpus

    variants = tuple(SHORT_NAMES[v] for v in args.variants.split(","))
    with open(shipped_corpus("wiki_sentences.txt"), encoding="utf-8") as f:
        texts = [line.strip() for line in f if line.strip()][: (args.steps + 1) * args.batch]
    batches = [texts[i : i + args.batch] for i in range(0, len(texts), args.batch)]
    result = step_ab(default_model_path(), batches, args.seq, args.threads, variants)
    baseline = result[variants[0]]["tokens_per_s"]
    for name in variants:
        row = result[name]
        print(json.dumps({"variant": name, **row, "x_first": row["tokens_per_s"] / baseline}))


if __name__ == "__main__":
    main()
