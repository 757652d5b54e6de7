"""Section 5: InfoCSE annotation through Ray Data actors against one plain process."""

from __future__ import annotations

from bench.annotation import annotate_locally, annotate_with_ray, lee_documents
from bench.context import BenchContext
from bench.report import ratio


def run(bench: BenchContext) -> None:
    """Fills table 5."""
    a = bench.args
    documents = lee_documents(a.annotation_docs)
    few = documents[:2]
    paths = [
        lambda docs: annotate_locally(bench.model, docs, a.threads),
        lambda docs: annotate_with_ray(bench.model, docs, 1, a.threads),
        lambda docs: annotate_with_ray(bench.model, docs, 2, max(1, a.threads // 2)),
    ]
    # Each path twice, on 2 documents and on all: the difference removes the fixed cost
    # (actor start-up, model loads) and leaves the marginal rate of a longer round. A --tiny
    # smoke run has no rate to separate from start-up noise: one run per path, and the
    # fixed-cost and marginal columns say "–".
    runs = [(None if a.tiny else path(few), path(documents)) for path in paths]
    bench.results["raw"]["annotation"] = [[vars(r) for r in pair if r] for pair in runs]
    table = bench.table(
        "annotation",
        f"5. InfoCSE annotation: {runs[0][1].documents} Lee documents, "
        f"{runs[0][1].sentences} sentences",
        [
            "path",
            "seconds",
            "sentences/s",
            "× one process",
            "fixed cost s",
            "marginal sentences/s",
            "marginal × one process",
            "pairs",
        ],
    )

    def marginal(pair) -> float | None:
        small, full = pair
        if small is None:
            return None
        extra = full.seconds - small.seconds
        # None when the noise of start-up swamps the extra work (tiny runs).
        return (full.sentences - small.sentences) / extra if extra > 0 else None

    def fixed(pair) -> float | None:
        small, _ = pair
        rate = marginal(pair)
        return max(0.0, small.seconds - small.sentences / rate) if rate else None

    local_rate, local_marginal = runs[0][1].sentences_per_s, marginal(runs[0])
    for pair in runs:
        full, rate = pair[1], marginal(pair)
        relative = ratio(rate / local_marginal) if rate and local_marginal else "–"
        table.add(
            full.name,
            full.seconds,
            full.sentences_per_s,
            ratio(full.sentences_per_s / local_rate),
            fixed(pair),
            rate,
            relative,
            full.pairs,
        )
    table.notes.append(
        "End to end as an InfoCSE round pays it (Ray: actor start-up, one model load per "
        "actor, Parquet writing); one actor has the same torch threads as the one "
        "process. Fixed "
        "cost and marginal rate come from a second run of each path on 2 documents: "
        "marginal = extra sentences / extra seconds, what a long round approaches."
    )
