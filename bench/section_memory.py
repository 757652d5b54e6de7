"""Section 6: peak resident memory of one worker's training step, measured in a fresh process
per batch size, beside what the real Ray Train workers reported.

    python -m bench.section_memory --model DIR --batch 32 --seq 32 --threads 1

Run on its own (as table 6 runs it, once per batch size), it builds what a Ray Train worker
builds (the project's TrainableEncoder, the DDP engine with its AdamW state, the real step from
train/step.py) and runs steps on full-length batches (every row `seq` tokens: the worst case
dynamic padding can meet), then prints one JSON line: the RSS after building (weights), and the
peak (VmHWM) after the steps (weights, gradients, Adam moments, activations). A fresh process
per batch size, because the high-water mark never goes down; it runs this file as a script,
so the module imports nothing from `bench` at its top.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.context import BenchContext
    from bench.project_runs import ProjectRun


def rss_mb() -> float:
    """Current resident memory (from /proc/self/statm pages)."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 1024**2


def measure(model_path: str, batch: int, seq: int, threads: int, steps: int) -> dict:
    import torch
    import transformers

    from distributed_emb.losses.loss_config import LossConfig
    from distributed_emb.model.encoder import TrainableEncoder
    from distributed_emb.train.engine import build_engine
    from distributed_emb.train.step import plain_step
    from distributed_emb.train.train_config import TrainLoopConfig
    from distributed_emb.train.worker import peak_rss_mb  # VmHWM, as the workers report

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    encoder = TrainableEncoder(model_path, pooler="mean", mlp_head=True)
    encoder.train()
    engine = build_engine(encoder, TrainLoopConfig(batch_size=batch), steps, torch.device("cpu"))
    weights = LossConfig(temperature=0.05, reconstruction_weight=0.1)
    built = rss_mb()
    vocab = encoder.backbone.config.vocab_size
    ids = torch.randint(1000, vocab, (batch, seq))
    tensors = {
        "input_ids": torch.cat([ids, ids]),  # (2B, L)
        "attention_mask": torch.ones(2 * batch, seq, dtype=torch.long),
    }
    for _ in range(steps):
        plain_step(engine, tensors, weights, sync=True)
        engine.step()
    return {"batch": batch, "seq": seq, "built_mb": built, "peak_mb": peak_rss_mb()}


def run(
    bench: BenchContext,
    one_worker: list[ProjectRun] | None,
    two_workers: list[ProjectRun] | None,
) -> None:
    """Fills table 6. `one_worker` and `two_workers` are the project's Ray Train runs (1 worker;
    2 workers with the gather); None leaves their rows empty."""
    a = bench.args
    rows = []
    for batch in [int(b) for b in a.memory_batches.split(",")]:
        command = [
            sys.executable,
            __file__,
            "--model",
            bench.model,
            "--batch",
            str(batch),
            "--seq",
            str(a.seq),
            "--threads",
            str(a.threads),
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"section_memory.py --batch {batch} failed: {done.stderr[-800:]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    bench.results["raw"]["memory"] = rows
    table = bench.table(
        "memory",
        f"6. Memory: peak RSS of one worker's step (full-length batches of {a.seq} tokens)",
        ["process", "batch", "peak RSS MB", "after building MB", "step adds MB"],
    )
    for row in rows:
        table.add(
            "fresh process, project step",
            row["batch"],
            row["peak_mb"],
            row["built_mb"],
            row["peak_mb"] - row["built_mb"],
        )
    table.add(
        "Ray Train worker, 1 worker (section 1)",
        a.batch,
        max(r.peak_rss_mb for r in one_worker) if one_worker else None,
        None,
        None,
    )
    table.add(
        "Ray Train worker, rank 0 of 2 (section 3)",
        a.batch,
        max(r.peak_rss_mb for r in two_workers) if two_workers else None,
        None,
        None,
    )
    if len(rows) >= 2:
        slope = (rows[-1]["peak_mb"] - rows[0]["peak_mb"]) / (rows[-1]["batch"] - rows[0]["batch"])
        table.notes.append(
            f"Growth: about {slope:.1f} MB per extra sentence in the batch (two views of "
            f"{a.seq} tokens each). Peaks are the process's VmHWM; the Ray worker rows "
            "are what the loop reports (`peak_rss_mb`) at each evaluation: real batches, "
            "dynamically padded, plus Ray's own buffers."
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description="Peak resident memory of one worker's training step, measured in a fresh "
        "process."
    )
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    print(json.dumps(measure(args.model, args.batch, args.seq, args.threads, args.steps)))


if __name__ == "__main__":
    main()
