"""Section 4: the data path (reading, Ray Data batches, tokenising) against how fast training
consumes sentences."""

from __future__ import annotations

from bench.context import BenchContext
from bench.data_path import time_data_path
from bench.project_runs import ProjectRun
from bench.report import median, percent, ratio


def run(
    bench: BenchContext,
    one_worker: list[ProjectRun] | None,
    two_workers: list[ProjectRun] | None,
) -> None:
    """Fills table 4. `one_worker` and `two_workers` are the project's Ray Train runs (1 worker;
    2 workers with the gather); None leaves their rows empty."""
    a = bench.args
    timing = time_data_path(
        bench.model, a.batch, a.seq, a.data_batches, ["max_rows=2000"] if a.tiny else []
    )
    bench.results["raw"]["data"] = vars(timing)
    consumption = median([r.sentences_per_s for r in one_worker]) if one_worker else None
    table = bench.table(
        "data_path",
        "4. Data path: reading and tokenising against training consumption",
        ["stage", "sentences/s", "× training consumption (1 worker)", "worker data wait"],
    )

    def headroom(rate):
        return ratio(rate / consumption) if consumption else "–"

    read_rate = timing.rows / timing.read_s
    table.add(
        f"read + clean corpus ({timing.rows:,} rows, Ray Data tasks)",
        read_rate,
        headroom(read_rate),
        "–",
    )
    table.add(
        "feeder slices + collate (1 rank)",
        timing.iterate_sentences_per_s,
        headroom(timing.iterate_sentences_per_s),
        "–",
    )
    table.add(
        "collate only (tokenise 2 views, no Ray)",
        timing.tokenise_sentences_per_s,
        headroom(timing.tokenise_sentences_per_s),
        "–",
    )
    if one_worker:
        table.add(
            "training consumption, 1 worker",
            consumption,
            ratio(1.0),
            percent(median([r.data_wait_fraction for r in one_worker])),
        )
    else:
        table.add("training consumption, 1 worker", None, "–", "–")
    if two_workers:
        table.add(
            "training consumption, 2 workers (global)",
            median([r.sentences_per_s for r in two_workers]),
            "–",
            percent(median([r.data_wait_fraction for r in two_workers])),
        )
    else:
        table.add("training consumption, 2 workers (global)", None, "–", "–")
    table.notes.append(
        f"The Ray Data pipeline's first batch came after {timing.first_batch_s:.2f} s "
        "(start-up, paid once per epoch inside the first window). "
        "Worker data wait = share of the training windows' wall time spent in "
        "`next(batches)` (the loop's data_wait_s / window_s): the time compute sat idle "
        "waiting for the data path. Read + clean runs once per run on the driver."
    )
