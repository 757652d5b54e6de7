"""GradCache's price and payoff: peak memory per worker and sentences/s, with and without it.

    python -m bench.grad_cache_memory [--global-batches 256,1024,4096] [--mini-batch-size 64]
        [--no-cache-max 512] [--steps 1] [--json out.json]
    python -m bench.grad_cache_memory [--json out.json] --watch python jobs/train_informin.py ...

For each global batch G and each mode (plain step, cached step with mini-batches of m), two
fresh worker processes (gloo, as Ray Train's CPU workers) load the packaged all-MiniLM-L6-v2
under DDPEngine, tokenise G/2 shipped Wikipedia sentences each at max_seq_length 32, and run
`--steps` full optimizer steps (forward, InfoNCE over the gathered G rows + λ·reconstruction,
backward, AdamW). Each worker reports its peak RSS (VmHWM: the high-water mark of the whole
process, model and optimizer included) before the first step and after the last, and the wall
time of the steps. Fresh processes per configuration, so one run's peak never hides another's.

Memory is the robust number. Speed is sentences per second of optimizer steps (both views
count once) and is noisy on a shared machine; ratios are against the plain step in the same run.
Plain steps above `--no-cache-max` are not run: their activations grow linearly with the batch
(the table says so instead of swapping the machine to death).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from distributed_emb.tables import markdown_table
from distributed_emb.train.train_config import TrainLoopConfig

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

WORKERS = 2
MAX_SEQ_LENGTH = 32


# The DDPEngine knobs of the default InforMin-CL config.
TRAIN = TrainLoopConfig(max_grad_norm=1.0, learning_rate=1e-5)


def _peak_rss_mib() -> float:
    # VmHWM: this process image's own high-water mark (ru_maxrss would also keep the RSS the
    # spawned worker had as a fork of this script before it exec'd).
    from distributed_emb.train.worker import peak_rss_mb

    return peak_rss_mb()


def _worker(rank: int, init_file: str, per_worker: int, mini: int | None, steps: int, out: str):
    import numpy as np
    import torch
    import torch.distributed as dist
    from transformers import AutoTokenizer

    from distributed_emb.data.collate import ContrastiveCollator
    from distributed_emb.losses.loss_config import LossConfig
    from distributed_emb.model.encoder import TrainableEncoder
    from distributed_emb.paths import default_model_path, shipped_corpus
    from distributed_emb.train.engine import DDPEngine
    from distributed_emb.train.grad_cache import cached_step
    from distributed_emb.train.step import plain_step

    torch.set_num_threads(1)  # 2 workers on 2 cores
    torch.manual_seed(42 + rank)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    path = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    encoder = TrainableEncoder(path, pooler="mean", mlp_head=True).train()
    engine = DDPEngine(encoder, TRAIN, total_steps=steps, device=torch.device("cpu"))
    weights = LossConfig(temperature=0.05, reconstruction_weight=0.1)
    collate = ContrastiveCollator(tokenizer, MAX_SEQ_LENGTH)
    lines = [s for s in Path(shipped_corpus("wiki_sentences.txt")).read_text().splitlines() if s]
    batches = []
    for step in range(steps):
        start = (step * WORKERS + rank) * per_worker
        batches.append(collate({"text": np.array(lines[start : start + per_worker])}))
    rss_before = _peak_rss_mib()

    dist.barrier()
    started = time.perf_counter()
    for batch in batches:
        if mini is None:
            metrics = plain_step(engine, batch, weights, sync=True)
        else:
            metrics = cached_step(engine, batch, weights, mini, sync=True)
        engine.step()
    seconds = time.perf_counter() - started
    result = {
        "rank": rank,
        "seconds": seconds,
        "loss": float(metrics["loss"]),
        "rss_before_step_mib": rss_before,
        "peak_rss_mib": _peak_rss_mib(),
        "real_tokens": int(sum(int(b["num_real_tokens"]) for b in batches)),
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def run_configuration(global_batch: int, mini: int | None, steps: int) -> dict:
    import torch.multiprocessing as mp

    per_worker = global_batch // WORKERS
    with tempfile.TemporaryDirectory() as directory:
        mp.spawn(
            _worker,
            args=(str(Path(directory) / "init"), per_worker, mini, steps, directory),
            nprocs=WORKERS,
            join=True,
        )
        ranks = [json.loads(Path(directory, f"rank{r}.json").read_text()) for r in range(WORKERS)]
    seconds = max(r["seconds"] for r in ranks)  # the step ends when the slower worker does
    return {
        "global_batch": global_batch,
        "per_worker": per_worker,
        "mini_batch_size": mini,
        "steps": steps,
        "seconds": seconds,
        "sentences_per_s": global_batch * steps / seconds,
        "peak_rss_mib": max(r["peak_rss_mib"] for r in ranks),
        "rss_before_step_mib": max(r["rss_before_step_mib"] for r in ranks),
        "loss": ranks[0]["loss"],
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_table(rows: list[dict], skipped: list[tuple[int, str]]) -> str:
    plain = {r["global_batch"]: r for r in rows if r["mini_batch_size"] is None}
    columns = [
        "global batch",
        "per worker",
        "mode",
        "peak RSS / worker (MiB)",
        "of which step (MiB)",
        "RSS vs plain",
        "sentences/s",
        "speed vs plain",
    ]
    cells = []
    for r in rows:
        mode = "plain" if r["mini_batch_size"] is None else f"cached, m={r['mini_batch_size']}"
        base = plain.get(r["global_batch"])
        rss_ratio = f"{r['peak_rss_mib'] / base['peak_rss_mib']:.2f}×" if base else "–"
        speed_ratio = f"{r['sentences_per_s'] / base['sentences_per_s']:.2f}×" if base else "–"
        cells.append(
            [
                f"{r['global_batch']:,}",
                f"{r['per_worker']:,}",
                mode,
                f"{r['peak_rss_mib']:,.0f}",
                f"{r['peak_rss_mib'] - r['rss_before_step_mib']:,.0f}",
                rss_ratio,
                f"{r['sentences_per_s']:.1f}",
                speed_ratio,
            ]
        )
    for global_batch, why in skipped:
        cells.append(
            [f"{global_batch:,}", f"{global_batch // WORKERS:,}", "plain", f"not run: {why}"]
        )
    return markdown_table(columns, cells, right_aligned="rr-rrrrr")


def watch_command(command: list[str], interval_s: float = 0.5) -> dict:
    """Run `command` and sample the RSS of it and every descendant (Ray's raylet, its train
    workers) every `interval_s`: the peak per process, named by its title, and the peak total.

    For the real Ray job, whose workers are not this script's children to getrusage. Sampling
    can miss a peak shorter than the interval; the step's activations live for seconds.
    """
    import subprocess

    import psutil  # installed with ray[default]

    started = time.perf_counter()
    process = subprocess.Popen(command)
    root = psutil.Process(process.pid)
    peaks: dict[int, tuple[float, str]] = {}
    peak_total = 0.0
    while process.poll() is None:
        total = 0.0
        try:
            processes = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        for proc in processes:
            try:
                rss = proc.memory_info().rss / 2**20
                name = " ".join(proc.cmdline())[:80] or proc.name()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            total += rss
            if rss > peaks.get(proc.pid, (0.0, ""))[0]:
                peaks[proc.pid] = (rss, name)
        peak_total = max(peak_total, total)
        time.sleep(interval_s)
    top = sorted(peaks.values(), reverse=True)[:6]
    return {
        "returncode": process.wait(),
        "wall_s": time.perf_counter() - started,
        "peak_total_rss_mib": peak_total,
        "peak_rss_mib_by_process": [{"rss_mib": round(r), "process": n} for r, n in top],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--global-batches", default="256,1024,4096")
    parser.add_argument("--mini-batch-size", type=int, default=64)
    parser.add_argument(
        "--no-cache-max", type=int, default=512, help="largest global batch run without caching"
    )
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument(
        "--watch",
        nargs=argparse.REMAINDER,
        help="instead: run this command (e.g. python jobs/train_informin.py ...) and report the "
        "peak RSS of each of its processes",
    )
    args = parser.parse_args(argv)
    if args.watch:
        report = watch_command(args.watch)
        print(json.dumps(report, indent=1))
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1))
        return report["returncode"]

    rows, skipped = [], []
    for global_batch in [int(g) for g in args.global_batches.split(",")]:
        if global_batch % WORKERS:
            parser.error(f"global batch {global_batch} is not divisible by {WORKERS} workers")
        modes = [None, args.mini_batch_size]
        if global_batch > args.no_cache_max:
            modes = [args.mini_batch_size]
            skipped.append((global_batch, f"above --no-cache-max {args.no_cache_max}"))
        for mini in modes:
            row = run_configuration(global_batch, mini, args.steps)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    print(
        f"{platform.node()}: {os.cpu_count()} CPUs, {_cpu_model()}, load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end, "
        f"{WORKERS} gloo workers × 1 torch thread, all-MiniLM-L6-v2, max_seq_length "
        f"{MAX_SEQ_LENGTH}, fp32, {args.steps} optimizer step(s) per configuration"
    )
    print(memory_table(rows, skipped))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "skipped": skipped}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
