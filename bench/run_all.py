"""All CPU benchmarks in one run, as ratios measured side by side.

    python -m bench.run_all [--output bench_results] [--threads 1] [--rounds 3]
    python -m bench.run_all --tiny --model DIR     # seconds-scale smoke run (tests use it)
    python -m bench.run_all --sections memory      # some sections only, in their usual order

On a shared machine absolute speeds drift with everyone else's load, so every comparison is
made inside one run: contenders are interleaved (their order rotates each round), each round
gives one ratio, and the table reports medians. The load average is recorded before and
after every section. Writes results.json and results.md to --output and prints the tables.

Sections (see docs/BENCHMARKS.md), one module each: 1 training step, one worker (project vs
bare PyTorch vs sentence-transformers) and 2 hardware ceiling (MFU against a matmul measured in
the same run), bench/section_step.py; 3 cross-worker negatives (2 workers, with and without
the gather), bench/section_negatives.py; 4 data path, bench/section_data.py; 5 InfoCSE
annotation (Ray actors vs one process), bench/section_annotation.py; 6 memory per worker,
bench/section_memory.py; 7 where a step's time goes, bench/section_profile.py. What they share
(settings, tables, results, the project's config) is bench/context.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import TypeVar

# Before torch, tokenizers or Ray are imported (the section modules load them): offline, no
# tokenizer thread pool fighting the torch threads, and patience for worker start-up on a
# loaded machine.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "600")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

import ray

from bench import (
    section_annotation,
    section_data,
    section_memory,
    section_negatives,
    section_profile,
    section_step,
)
from bench.context import BenchContext
from bench.machine import load_now, uptime_line
from bench.project_runs import ProjectRun

# tests/bench import the contender labels and the regrouping from the harness's entry point.
from bench.section_step import BARE, BARE_GROUPED, PROJECT, PROJECT_GROUPED, ST, length_grouped
from distributed_emb.runtime import start_local_ray

__all__ = [
    "BARE",
    "BARE_GROUPED",
    "PROJECT",
    "PROJECT_GROUPED",
    "SECTIONS",
    "ST",
    "length_grouped",
    "main",
    "parse_args",
]

SECTIONS = ("step", "negatives", "data", "annotation", "memory", "profile")
Result = TypeVar("Result")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="bench_results", help="directory for JSON + markdown")
    parser.add_argument("--model", default=None, help="default: packaged all-MiniLM-L6-v2")
    parser.add_argument("--batch", type=int, default=32, help="per-worker batch (sentences)")
    parser.add_argument("--seq", type=int, default=32, help="max sequence length")
    parser.add_argument(
        "--threads",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="torch threads of every single-worker contender",
    )
    parser.add_argument("--steps", type=int, default=4, help="timed steps per contender per round")
    parser.add_argument(
        "--warmup", type=int, default=2, help="untimed steps first (the project's first window)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument(
        "--negative-rounds",
        type=int,
        default=1,
        help="rounds of the 2-worker gather / no-gather pair",
    )
    parser.add_argument("--memory-batches", default="16,32,64,128")
    parser.add_argument(
        "--annotation-docs",
        type=int,
        default=60,
        help="Lee news documents to annotate (about 8.7 sentences each)",
    )
    parser.add_argument("--data-batches", type=int, default=60)
    parser.add_argument("--profile-steps", type=int, default=2)
    parser.add_argument(
        "--ab-steps",
        type=int,
        default=16,
        help="steps per variant in the step-by-step A/B (section 7c)",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=10.0,
        help="seconds to wait after each Ray Train run (its processes wind down)",
    )
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="smallest settings everywhere (smoke test with a tiny model)",
    )
    parser.add_argument("--verbose", action="store_true", help="show Ray's worker logs")
    args = parser.parse_args(argv)
    if args.tiny:
        args.batch, args.seq, args.steps, args.warmup, args.rounds = 4, 16, 1, 1, 1
        args.memory_batches, args.annotation_docs, args.data_batches = "4,8", 4, 3
        args.profile_steps, args.threads, args.settle, args.ab_steps = 1, 1, 0.0, 2
    unknown = set(args.sections.split(",")) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; known: {list(SECTIONS)}")
    return args


def start_ray(args: argparse.Namespace) -> None:
    start_local_ray(  # our own instance, whatever else runs on the machine
        # Logical CPUs above the core count: the sections run Train runs, annotation and
        # encoding pools back to back in one instance, and a section's leftovers (a Train
        # controller shutting down) must not starve the next one's Ray Data tasks.
        num_cpus=2 * (os.cpu_count() or 1),
        include_dashboard=False,
        object_store_memory=512 * 1024**2 if args.tiny else 1024**3,
        log_to_driver=args.verbose,
        runtime_env={
            "env_vars": {
                k: os.environ[k]
                for k in (
                    "HF_HUB_OFFLINE",
                    "TOKENIZERS_PARALLELISM",
                    "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S",
                )
                if k in os.environ
            }
        },
    )


def run_section(bench: BenchContext, name: str, function: Callable[[], Result]) -> Result | None:
    """The section's result, or None when it failed (the error is recorded)."""
    print(f"[bench] {name} … (load {load_now()})", flush=True)
    started = time.perf_counter()
    result = None
    try:
        result = function()
    except Exception as error:  # one broken section must not lose the others' numbers
        traceback.print_exc()
        bench.results["errors"].append({"section": name, "error": repr(error)[:500]})
    bench.record_load(f"after {name}")
    print(f"[bench] {name} done in {time.perf_counter() - started:.0f} s", flush=True)
    bench.save()
    return result


def run_sections(bench: BenchContext, chosen: list[str]) -> None:
    one_worker: list[ProjectRun] | None = None  # section 1's project runs
    two_workers: list[ProjectRun] | None = None  # section 3's runs with the gather

    def project_runs() -> tuple[list[ProjectRun] | None, list[ProjectRun] | None]:
        # Sections 4 and 6 also report the Ray Train runs of sections 1 and 3. When those were
        # not chosen, one run of each is made here (once for both), so a section run alone has
        # the same rows as in a full run; when they were chosen but failed, the rows stay
        # empty rather than failing a second section.
        nonlocal one_worker, two_workers
        if one_worker is None and "step" not in chosen:
            print("[bench]   section 1 not chosen: one project run, 1 worker", flush=True)
            one_worker = [bench.run_project(section_step.one_worker_config(bench))]
        if two_workers is None and "negatives" not in chosen:
            print("[bench]   section 3 not chosen: one project run, 2 workers", flush=True)
            two_workers = [bench.run_project(section_negatives.two_worker_config(bench))]
        return one_worker, two_workers

    if "step" in chosen:
        one_worker = run_section(bench, "step", lambda: section_step.run(bench))
    if "negatives" in chosen:
        two_workers = run_section(bench, "negatives", lambda: section_negatives.run(bench))
    if "data" in chosen:
        run_section(bench, "data", lambda: section_data.run(bench, *project_runs()))
    if "annotation" in chosen:
        run_section(bench, "annotation", lambda: section_annotation.run(bench))
    if "memory" in chosen:
        run_section(bench, "memory", lambda: section_memory.run(bench, *project_runs()))
    if "profile" in chosen:
        run_section(bench, "profile", lambda: section_profile.run(bench))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench = BenchContext(args)
    start_ray(args)
    started = time.perf_counter()
    try:
        run_sections(bench, args.sections.split(","))
    finally:
        ray.shutdown()
    bench.results["wall_s"] = round(time.perf_counter() - started, 1)
    bench.results["uptime"] = uptime_line()
    bench.save()
    print(bench.render())
    print(
        f"\n[bench] wrote {bench.output / 'results.json'} and {bench.output / 'results.md'} "
        f"in {bench.results['wall_s']:.0f} s"
    )
    return 1 if bench.results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
