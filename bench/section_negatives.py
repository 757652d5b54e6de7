"""Section 3: cross-worker negatives, two Ray Train workers with and without the gather."""

from __future__ import annotations

from bench.context import BenchContext
from bench.project_runs import ProjectRun
from bench.report import median, percent, ratio
from distributed_emb.config import TrainingConfig


def two_worker_config(bench: BenchContext, gather: bool = True) -> TrainingConfig:
    """Two workers, 1 CPU and 1 torch thread each; sections 4 and 6 report the gathered run
    too."""
    return bench.project_config(2, 1, gather)


def run(bench: BenchContext) -> list[ProjectRun]:
    """Fills table 3; returns the gathered runs (the default setting, one per round)."""
    a = bench.args
    runs: dict[bool, list[ProjectRun]] = {True: [], False: []}
    for round_index in range(a.negative_rounds):
        order = [True, False] if round_index % 2 == 0 else [False, True]
        for gather in order:
            print(f"[bench]   2 workers, gather={gather}", flush=True)
            runs[gather].append(bench.run_project(two_worker_config(bench, gather)))
    bench.results["raw"]["negatives"] = {str(k): [vars(r) for r in v] for k, v in runs.items()}
    table = bench.table(
        "negatives",
        f"3. Cross-worker negatives: 2 workers × batch {a.batch}, 1 CPU and 1 torch thread "
        f"each (median of {a.negative_rounds} round(s))",
        [
            "setting",
            "step s",
            "global sentences/s",
            "negatives per row",
            "global batch",
            "× gathered",
            "data wait",
        ],
    )
    base = median([r.step_s for r in runs[True]])
    for gather, label in (
        (True, "gathered negatives (default)"),
        (False, "local negatives (loss.gather_negatives=false)"),
    ):
        rs = runs[gather]
        step_s = median([r.step_s for r in rs])
        table.add(
            label,
            step_s,
            median([r.sentences_per_s for r in rs]),
            rs[0].negatives_per_row,
            rs[0].global_batch,
            ratio(base / step_s),
            percent(median([r.data_wait_fraction for r in rs])),
        )
    table.notes.append(
        "× gathered is speed relative to the gathered run (step time ratio). Both settings "
        "train on the same global batch of sentences; the gather changes how many "
        "candidates each row's softmax sees (W·B instead of B)."
    )
    return runs[True]
