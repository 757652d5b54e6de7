"""InfoCSE annotation speed: Ray Data actors against one plain process, same thread budget.

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
