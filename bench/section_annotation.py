"""Section 5: InfoCSE annotation speed, Ray Data actors against one plain process, same
thread budget.

Both sides go through distributed_emb/infocse/annotate.py's public functions on the shipped Lee
news documents: `annotate_documents` (a Ray Data actor pool, each actor loading the model once,
pairs written to Parquet) and `annotate_documents_locally` (the same embed-and-cluster steps in
this process, the same number of documents per encode call). Wall time is end to end, as an
InfoCSE round pays it: actor start-up and model loading are included.
"""

from __future__ import annotations

import itertools
import json
import shutil
import tempfile
from dataclasses import dataclass

from bench.context import BenchContext
from bench.report import ratio


@dataclass
class AnnotationTiming:
    name: str
    actors: int  # 0: in this process
    threads_per_actor: int
    documents: int
    sentences: int
    pairs: int
    seconds: float

    @property
    def sentences_per_s(self) -> float:
        return self.sentences / self.seconds


def lee_documents(limit: int) -> list[dict]:
    from distributed_emb.paths import shipped_corpus

    with open(shipped_corpus("lee_documents.jsonl")) as handle:
        rows = [json.loads(line) for line in itertools.islice(handle, limit)]
    return [{"doc_id": str(r["id"]), "sentences": r["sentences"]} for r in rows]


def annotate_locally(model_path: str, documents: list[dict], threads: int) -> AnnotationTiming:
    import torch

    from distributed_emb.infocse.annotate import AnnotationConfig, annotate_documents_locally

    previous = torch.get_num_threads()
    config = AnnotationConfig(torch_threads=threads)
    try:
        _, result = annotate_documents_locally(
            documents, model_path, config=config, documents_per_encode=config.documents_per_batch
        )
    finally:
        torch.set_num_threads(previous)  # the embedder set it for this whole process
    c = result.counts
    return AnnotationTiming(
        f"one process, {threads} thread(s)",
        0,
        threads,
        c.documents,
        c.sentences,
        c.pairs,
        result.wall_seconds,
    )


def annotate_with_ray(
    model_path: str, documents: list[dict], actors: int, threads_per_actor: int
) -> AnnotationTiming:
    import ray

    from distributed_emb.infocse.annotate import AnnotationConfig, annotate_documents

    config = AnnotationConfig(
        concurrency=actors,
        torch_threads=threads_per_actor,
        num_cpus_per_actor=float(threads_per_actor),
    )
    output_dir = tempfile.mkdtemp(prefix="bench_pairs_")
    try:
        result = annotate_documents(
            ray.data.from_items(documents), model_path, f"{output_dir}/pairs", config=config
        )
    finally:
        shutil.rmtree(output_dir, ignore_errors=True)
    c = result.counts
    return AnnotationTiming(
        f"Ray Data, {actors} actor(s) × {threads_per_actor} thread(s)",
        actors,
        threads_per_actor,
        c.documents,
        c.sentences,
        c.pairs,
        result.wall_seconds,
    )


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
