"""Section 6: peak memory of one worker's step, in a fresh process per batch size
(bench/memory.py), beside what the real Ray Train workers reported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.context import BenchContext
from bench.project_runs import ProjectRun

MEMORY_SCRIPT = Path(__file__).with_name("memory.py")


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
            str(MEMORY_SCRIPT),
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
            raise RuntimeError(f"memory.py --batch {batch} failed: {done.stderr[-800:]}")
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
