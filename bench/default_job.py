"""The benchmark users care about: `python jobs/train_informin.py` as they run it, against the
naive single-process script and sentence-transformers' SimCSE recipe at the same global batch.

    python -m bench.default_job [--rounds 2] [--steps 20] [--job "label=key=v,key=v" ...]

Each round runs every contender back to back, the order rotating by round, so load drift on a
shared machine hits all of them alike; only ratios within a round mean anything, and the
table gives the median of the per-round ratios. Contenders:

- naive: one process, every core as torch threads, fp32, the global batch in one step, both
  views in one forward (bench/baselines.py BareLoop: what a person writes by hand);
- sentence-transformers: its SimCSE recipe (MNRL on (s, s)), the same batch and threads;
- job: the default training job, a subprocess (`python jobs/train_informin.py` with
  `train.max_steps` set and evaluation cut to a few dev pairs), read from its own
  train_log.jsonl: the logged intervals after the first (start-up, warm-up step and the step-0
  evaluation excluded; data waits, tokenisation and Ray included);
- job variants: `--job "label=key=value,key=value"` adds the job with those overrides.

tokens/s counts real (non-padding) tokens of both views. MFU is model FLOPs (3 × forward
matmul FLOPs of the real tokens at a context of half the maximum length, bench/flops.py) over
the machine's fp32 matmul rate measured in this run. Quality after equal steps is a separate
command (docs/BENCHMARKS.md, "Fast by default"): this benchmark's runs are too short for it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.machine import describe_machine, uptime_line
from distributed_emb.tables import markdown_table

ROOT = Path(__file__).resolve().parents[1]

NAIVE = "naive script (1 process, fp32, global batch in one step)"
RECIPE = "sentence-transformers SimCSE recipe (MNRL)"
JOB = "default job: python jobs/train_informin.py"


def job_tokens_per_s(log_path: Path, skip_lines: int = 1) -> dict:
    """Real tokens/s of a run's training intervals from its train_log.jsonl (its `train`
    lines: each covers the steps since the line before, evaluation time left out), the first
    `skip_lines` intervals left out (warm-up). An interval's wall time is its sentences over
    its sentences/s; tokens = tokens/s × wall. The global batch comes from the evaluation
    lines."""
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    batches = [line["global_batch"] for line in lines if "global_batch" in line]
    if not batches:
        raise ValueError(f"{log_path}: no line states the global batch")
    steps = [line for line in lines if line.get("kind") == "train" and "tokens_per_s" in line]
    kept = steps[skip_lines:]
    if not kept:
        raise ValueError(f"{log_path}: no training interval after the first {skip_lines}")
    wall = tokens = 0.0
    previous = steps[skip_lines - 1]["step"] if skip_lines else 0
    for line in kept:
        sentences = (line["step"] - previous) * batches[0]
        seconds = sentences / line["sentences_per_s"]
        wall += seconds
        tokens += line["tokens_per_s"] * seconds
        previous = line["step"]
    return {"tokens_per_s": tokens / wall, "seconds": wall, "steps": kept[-1]["step"]}


def run_job(overrides: list[str], steps: int, log_every: int, workdir: Path) -> dict:
    """The training job in a subprocess, exactly as users start it plus a short schedule."""
    out = workdir / f"job{time.monotonic_ns()}"
    command = [
        sys.executable,
        str(ROOT / "jobs" / "train_informin.py"),
        f"train.max_steps={steps}",
        f"eval.eval_steps={steps}",
        "eval.max_pairs=20",
        "eval.test_after_training=false",
        f"logging.logging_steps={log_every}",
        "logging.tensorboard=false",
        "logging.progress_bar=off",
        *overrides,
        "--output",
        str(out),
    ]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    result = job_tokens_per_s(out / "train_log.jsonl")
    result["wall_s"] = time.perf_counter() - started
    result["layout"] = _layout_line(out / "run.log")
    return result


def _layout_line(run_log: Path) -> str:
    if not run_log.is_file():
        return ""
    for line in run_log.read_text().splitlines():
        if "layout:" in line:
            return line.split("layout:", 1)[1].strip()
    return ""


def corpus_batches(batch: int, count: int, seed: int) -> list[list[str]]:
    from distributed_emb.paths import shipped_corpus

    text = Path(shipped_corpus("wiki_sentences.txt")).read_text()
    sentences = [s for s in text.splitlines() if s.strip()]
    rng = random.Random(seed)
    return [rng.sample(sentences, batch) for _ in range(count)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20, help="job steps per round")
    parser.add_argument("--loop-steps", type=int, default=12, help="timed naive/recipe steps")
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--job", action="append", default=[], help="label=key=v,key=v")
    parser.add_argument("--no-recipe", action="store_true")
    parser.add_argument("--output", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    import torch
    import transformers
    from transformers import AutoConfig

    from bench.baselines import BareLoop, SentenceTransformersRecipe
    from bench.flops import matmul_flops_per_s, training_flops_per_token
    from distributed_emb.paths import default_model_path

    transformers.logging.set_verbosity_error()
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    model = default_model_path()
    total = 10_000
    loops = {NAIVE: BareLoop(model, args.seq, 1e-5, 0.05, 0.1, total)}
    if not args.no_recipe:
        loops[RECIPE] = SentenceTransformersRecipe(model, args.seq, 1e-5, 0.05, total)
    jobs = {JOB: []}
    for spec in args.job:
        label, _, overrides = spec.partition("=")
        jobs[f"{JOB} {label}"] = [o for o in overrides.split(",") if o]
    names = list(loops) + list(jobs)
    per_round: list[dict] = []
    loads = [("start", uptime_line())]
    with tempfile.TemporaryDirectory(prefix="default_job_") as tmp:
        for index in range(args.rounds):
            order = names[index % len(names) :] + names[: index % len(names)]
            measured = {}
            for name in order:
                if name in loops:
                    batches = corpus_batches(args.global_batch, args.loop_steps + 2, index)
                    timing = loops[name].run(batches, warmup=2)
                    measured[name] = {"tokens_per_s": timing.tokens_per_s}
                else:
                    log_every = max(1, args.steps // 4)
                    measured[name] = run_job(jobs[name], args.steps, log_every, Path(tmp))
                print(f"round {index + 1}: {name}: {measured[name]}", flush=True)
            per_round.append(measured)
            loads.append((f"after round {index + 1}", uptime_line()))
    rate = matmul_flops_per_s(threads)
    shape = AutoConfig.from_pretrained(model)
    # Attention context: half the maximum length, about the corpus's mean real length.
    per_token = training_flops_per_token(
        shape.hidden_size, shape.num_hidden_layers, shape.intermediate_size, args.seq / 2
    )
    rows = []
    for name in names:
        speeds = [r[name]["tokens_per_s"] for r in per_round]
        naive = [r[name]["tokens_per_s"] / r[NAIVE]["tokens_per_s"] for r in per_round]
        recipe = (
            [r[name]["tokens_per_s"] / r[RECIPE]["tokens_per_s"] for r in per_round]
            if RECIPE in loops
            else []
        )
        median_speed = statistics.median(speeds)
        rows.append(
            {
                "contender": name,
                "tokens_per_s": median_speed,
                "x_naive": statistics.median(naive),
                "x_naive_rounds": naive,
                "x_recipe": statistics.median(recipe) if recipe else None,
                "mfu": per_token * median_speed / rate,
                "layout": per_round[-1][name].get("layout", ""),
            }
        )
    result = {
        "machine": describe_machine(),
        "command": " ".join(["python -m bench.default_job", *(argv or sys.argv[1:])]),
        "load": loads,
        "matmul_gflops": rate / 1e9,
        "rows": rows,
        "rounds": per_round,
    }
    print(render(result))
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=2))
    return 0


def render(result: dict) -> str:
    lines = [
        f"Command: `{result['command']}`",
        "Load: " + "; ".join(f"{when}: {line}" for when, line in result["load"]),
        f"fp32 matmul rate: {result['matmul_gflops']:.0f} GFLOP/s",
        "",
    ]
    columns = [
        "contender", "real tokens/s", "× naive (per round)", "× sentence-transformers", "MFU"
    ]  # fmt: skip
    rows = []
    for row in result["rows"]:
        rounds = " · ".join(f"{x:.2f}" for x in row["x_naive_rounds"])
        recipe = f"{row['x_recipe']:.2f}×" if row["x_recipe"] is not None else "–"
        rows.append(
            [
                row["contender"],
                f"{row['tokens_per_s']:,.0f}",
                f"{row['x_naive']:.2f}× ({rounds})",
                recipe,
                f"{100 * row['mfu']:.1f}%",
            ]
        )
    lines.append(markdown_table(columns, rows))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
