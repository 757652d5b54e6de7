"""Reading `output.row_log` back: which rows a run trained, step by step, across restarts.

Each rank appends {"attempt", "epoch", "step", "rows"} per micro-batch to
trained_rows/rank<r>.jsonl (data/batches.py TrainedRowLog). An attempt that resumed from
a checkpoint at step s rolls back every earlier attempt's records after s; what is left is
what the finished model was trained on.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path


def row_log_records(output_dir: Path) -> list[dict]:
    return [
        {**json.loads(line), "rank": int(path.stem.removeprefix("rank"))}
        for path in sorted((Path(output_dir) / "trained_rows").glob("rank*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def kept_steps(records: list[dict]) -> dict[int, list[int]]:
    """{step: row ids every rank trained towards it} in the run's surviving history: a record
    is rolled back when a later attempt started at or before its step."""
    first_step = defaultdict(lambda: float("inf"))
    for record in records:
        first_step[record["attempt"]] = min(first_step[record["attempt"]], record["step"])
    steps: dict[int, list[int]] = defaultdict(list)
    for record in records:
        later = [first_step[a] for a in first_step if a > record["attempt"]]
        if not later or record["step"] < min(later):
            steps[record["step"]].extend(record["rows"])
    return dict(sorted(steps.items()))


def resumed_from(records: list[dict]) -> dict[int, int]:
    """{attempt: the checkpoint step it resumed from} for every attempt after the first."""
    starts: dict[int, int] = {}
    for record in records:
        if record["attempt"]:
            attempt = record["attempt"]
            starts[attempt] = min(starts.get(attempt, 10**9), record["step"] - 1)
    return dict(sorted(starts.items()))
