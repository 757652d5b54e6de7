"""Section 7: where a step's time goes (torch.profiler phases and top operators), and the
speed changes A/B'd step by step in one process."""

from __future__ import annotations

from bench.context import BenchContext
from bench.profile_step import profile_step
from bench.report import percent, ratio
from bench.step_ab import BEFORE, DEFAULT, VARIANTS, step_ab


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
        "data/global_batches.py's length grouping over the whole pool."
    )
