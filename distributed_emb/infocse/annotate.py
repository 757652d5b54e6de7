"""InfoCSE annotation: embed each document's sentences with the current model, cluster them (IDC),
and write the positive pairs ``{anchor, positive, doc_id, cluster_id, round}`` to Parquet.

Distributed path (:func:`annotate_documents`): the documents through the one encoding actor pool
(``model/embedder.py encoding_pool``), each actor a :class:`DocumentAnnotator` that loads the
model once. An actor embeds all sentences of a batch of documents in one
``encode`` call (sorted by length inside sentence-transformers, so little padding), splits the
embeddings back per document and runs :func:`~distributed_emb.infocse.idc.intra_document_clusters`.

Reference path (:func:`annotate_documents_locally`): the same steps in one process, by
default one document per ``encode`` call, so a bug in batching documents together and
splitting them apart shows up as a difference between the two.

The cap on pairs per cluster is sampled with a seed derived from (``idc.seed``, doc_id), so a
document's pairs do not depend on which batch or actor it landed in. The rows both paths hand
along, their counts and the pairs' written order are annotation_tables.py's.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import ray
from pydantic import Field

from distributed_emb.infocse.annotation_tables import (
    DOCUMENT_ANNOTATION_SCHEMA,
    SPREAD_KEY,
    AnnotationCounts,
    counts_of,
    counts_table,
    explode_pairs,
    pairs_with_spread_key,
)
from distributed_emb.infocse.idc import IDCConfig, intra_document_clusters
from distributed_emb.model.embedder import Embedder, encoding_pool
from distributed_emb.progress_report import polled_progress, start_done_count
from distributed_emb.settings import section
from distributed_emb.storage import has_files
from distributed_emb.watchdog import DEFAULT_STALL_TIMEOUT_S, no_silent_stall

logger = logging.getLogger(__name__)

_SORT_BLOCK_PAIRS = 65_536  # pairs per block when sorting them into their training order


@section
class AnnotationConfig:
    """How annotation embeds, clusters and spreads over actors (a config section)."""

    model: Annotated[
        str | None,
        Field(
            description="the teacher that annotates rounds 1..annotation.teacher_rounds: a "
            "model path or hub name, or source (the model the student was cut from, see "
            "student.num_layers); later rounds are annotated by the trained model itself; "
            "null: every round is self-annotated"
        ),
    ] = None
    teacher_rounds: Annotated[
        int, Field(ge=1, description="rounds annotated by annotation.model (when set)")
    ] = 1
    pooler: Annotated[
        Literal["cls", "cls_before_pooler", "mean"] | None,
        Field(
            description="the sentence vector the annotating model gives: mean of tokens, "
            "[CLS] through the pooler, or raw [CLS]; null: a sentence-transformers directory's "
            "own pooling as saved (raw [CLS] for a plain Hugging Face model)"
        ),
    ] = None
    max_seq_length: Annotated[
        int | None,
        Field(
            ge=4,
            description="tokens per sentence when annotating; null: the initial model's own, "
            "for every round",
        ),
    ] = None
    encode_batch_size: Annotated[int, Field(ge=1, description="sentences per forward pass")] = 128
    documents_per_batch: Annotated[
        int, Field(ge=1, description="documents per map_batches call (one encode call)")
    ] = 8
    concurrency: Annotated[int, Field(ge=1, description="annotation actors")] = 2
    num_cpus_per_actor: Annotated[
        float | None,
        Field(
            gt=0,
            description="CPUs each annotation actor reserves; null: a share that leaves one "
            "CPU for Ray Data's own tasks",
        ),
    ] = None
    num_gpus_per_actor: Annotated[
        float, Field(ge=0, description="GPUs (or a share of one) each annotation actor reserves")
    ] = 0.0
    torch_threads: Annotated[
        int | None,
        Field(
            ge=1,
            description="torch threads per annotation actor; null: Ray's OMP setting for the "
            "actor's CPU share",
        ),
    ] = None
    stall_timeout_s: Annotated[
        float | None,
        Field(
            gt=0,
            description="fail the round, naming the resources, when the actor pool has waited "
            "this long for resources that never free; null: wait forever",
        ),
    ] = DEFAULT_STALL_TIMEOUT_S
    idc: IDCConfig = field(default_factory=IDCConfig)


@dataclass
class AnnotationResult:
    counts: AnnotationCounts
    wall_seconds: float
    pairs_path: str | None = None  # a directory of Parquet files, when written

    @property
    def sentences_per_second(self) -> float:
        return self.counts.sentences / self.wall_seconds if self.wall_seconds > 0 else math.nan

    def summary(self) -> str:
        c = self.counts
        return (
            f"annotated {c.documents} documents ({c.sentences} sentences) in "
            f"{self.wall_seconds:.1f} s ({self.sentences_per_second:.0f} sentences/s): "
            f"{c.clusters} clusters, {c.pairs} pairs, {c.documents_without_pairs} documents "
            f"without pairs, {c.capped_clusters} clusters capped"
        )


def document_seed(base_seed: int, doc_id: str) -> int:
    """A stable 63-bit seed per document (Python's hash() changes between processes)."""
    digest = hashlib.blake2b(f"{base_seed}\x00{doc_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _annotate_one(
    doc_id: str, sentences: Sequence[str], embeddings: np.ndarray, idc: IDCConfig
) -> dict:
    """IDC on one document → its row of `DOCUMENT_ANNOTATION_SCHEMA`."""
    result = intra_document_clusters(embeddings, idc, seed=document_seed(idc.seed, doc_id))
    return {
        "doc_id": doc_id,
        "num_sentences": len(sentences),
        "num_clusters": result.num_clusters,
        "capped_clusters": result.capped_clusters,
        "anchor": [sentences[i] for i in result.pairs[:, 0]],
        "positive": [sentences[j] for j in result.pairs[:, 1]],
        "cluster_id": result.pair_clusters.tolist(),
    }


class DocumentAnnotator(Embedder):
    """An :class:`~distributed_emb.model.embedder.Embedder` (the model loaded once per actor of
    the one encoding pool, ``model/embedder.py encoding_pool``) that clusters what it embeds:
    documents in, one annotation row per document out."""

    def __init__(self, model_path: str, idc: IDCConfig, done=None, **embedder_args) -> None:
        super().__init__(model_path, **embedder_args)
        self.idc = idc
        self.done = done  # a progress_report.DoneCount actor the documents are counted on

    def annotate(self, doc_ids: Sequence[str], sentence_lists: Sequence[Sequence[str]]) -> list:
        """Embed all documents' sentences in one call, split back, cluster each document."""
        if not doc_ids:
            return []
        flat = [s for sentences in sentence_lists for s in sentences]
        if flat:
            embeddings = self.embed(flat)  # (Σ nᵢ, d)
        else:
            embeddings = np.zeros((0, 1), dtype=np.float32)
        offsets = np.cumsum([len(s) for s in sentence_lists])[:-1]
        per_document = np.split(embeddings, offsets)  # [(nᵢ, d)]
        return [
            _annotate_one(doc_id, list(sentences), doc_embeddings, self.idc)
            for doc_id, sentences, doc_embeddings in zip(
                doc_ids, sentence_lists, per_document, strict=True
            )
        ]

    def __call__(self, batch: pa.Table) -> pa.Table:
        rows = self.annotate(
            batch.column("doc_id").to_pylist(), batch.column("sentences").to_pylist()
        )
        if self.done is not None:
            # Awaited (a millisecond a call): counted before the result is, so the count the
            # driver reads once the pass is done is the whole pass.
            ray.get(self.done.add.remote(len(rows)))
        return pa.Table.from_pylist(rows, schema=DOCUMENT_ANNOTATION_SCHEMA)


def documents_per_block(documents: int, config: AnnotationConfig) -> int:
    """Documents per Ray Data block (one actor task, several encode calls of
    documents_per_batch). Two pulls decide it:
    - balance: blocks are handed out at most two at a time per actor, and documents differ in
      length by 100× (4–637 sentences in the shipped wiki corpus); with few large blocks one
      actor sat alone on the wiki tail for a third of the run. So at least 8 blocks an actor;
    - the driver's memory: a task result under 100 KiB (Ray's max_direct_call_object_size) is
      kept in the memory of the process that owns it, the driver, not in the object store. An
      8-document block's pairs (~80 KB) all stayed there: 1.8× the driver's peak at 10× the
      documents (bench/infocse_scale.py). Up to 16 batches a block keep results above it.
    """
    batch = config.documents_per_batch
    balanced = documents // (8 * config.concurrency)
    return max(batch, min(16 * batch, balanced // batch * batch))


def _check_output_dir(output_dir: str) -> None:
    if has_files(output_dir):
        raise FileExistsError(
            f"{output_dir} already holds files; write each round's pairs to a new directory"
        )


def _writable(output_dir: str) -> str:
    """`output_dir` as a URI the write tasks can use. On object storage (s3://, gs://) any
    node writes there. A local path is a path on the driver's machine, where the driver reads
    the pairs back: `local://` runs the write tasks on the driver's node (files written by
    worker nodes would land on their own disks)."""
    if "://" in output_dir:
        return output_dir
    return f"local://{Path(output_dir).resolve()}"


def annotate_documents(
    documents,
    model_path: str,
    output_dir: str,
    round_index: int = 0,
    config: AnnotationConfig | None = None,
    reserve_cpus: bool = True,
) -> AnnotationResult:
    """Annotate a Ray Dataset of ``{doc_id, sentences}`` with a pool of model-holding actors.

    Writes the pairs to Parquet files under `output_dir` (which must be new or empty) and
    returns the counts. Uses the running Ray instance (or starts a local one).
    `reserve_cpus=False`: the actors reserve no CPU (annotation that overlaps training,
    infocse/overlap.py: the CPUs Ray could give are held by the Train workers and Ray Data).
    """
    config = config or AnnotationConfig()
    _check_output_dir(output_dir)
    if not ray.is_initialized():
        ray.init()
    num_cpus = config.num_cpus_per_actor if reserve_cpus else 0.0

    start = time.perf_counter()
    hint = "fix: annotation.concurrency, annotation.num_cpus_per_actor or the cluster's nodes"
    with no_silent_stall(config.stall_timeout_s, hint=hint):
        total = documents.count()
        block = documents_per_block(total, config)
        documents = documents.repartition(target_num_rows_per_block=block)
        # The one encoding pool (a plan that cannot fit fails before any actor starts: actors
        # that leave Ray Data no whole CPU for the read tasks wait forever for their input,
        # docs/OPERATIONS.md "Sizing a cluster"), each actor a DocumentAnnotator.
        done = start_done_count()  # the actors count their documents on it: the progress
        try:
            annotated = encoding_pool(
                documents,
                model_path,
                pooler=config.pooler,
                batch_size=config.encode_batch_size,
                max_seq_length=config.max_seq_length,
                concurrency=config.concurrency,
                num_cpus_per_actor=num_cpus,
                num_gpus_per_actor=config.num_gpus_per_actor,
                torch_threads=config.torch_threads,
                rows_per_call=config.documents_per_batch,
                batch_format="pyarrow",
                embedder_class=DocumentAnnotator,
                embedder_kwargs={"idc": config.idc, "done": done},
                max_tasks_in_flight_per_actor=2,
                role="annotation actors",
                fix="annotation.concurrency or annotation.num_cpus_per_actor",
            )
            # Off a terminal a line a minute from that count (a retried block counts again).
            with polled_progress(
                f"annotate round {round_index}",
                total,
                "documents",
                lambda: ray.get(done.count.remote()),
            ):
                annotated = annotated.materialize()  # embedded once; counted, written from it
        finally:
            ray.kill(done)

        counts = AnnotationCounts()
        for row in annotated.map_batches(counts_table, batch_format="pyarrow").iter_rows():
            counts.add(AnnotationCounts(**{k: int(v) for k, v in row.items()}))
        # Blocks arrive in whatever order actors finish them (another order on a rerun, or
        # after a lost node's actor is restarted elsewhere). Sorted by their spread key (a
        # distributed sort, on the cluster), the files hold the same rows in the same order
        # on every run, and that order spreads each document's pairs over the round, so
        # training batches mix documents without a pass over the pairs on the driver.
        pairs = annotated.map_batches(
            pairs_with_spread_key, batch_format="pyarrow",
            fn_kwargs={"round_index": round_index, "seed": config.idc.seed + round_index},
        )  # fmt: skip
        sort_blocks = max(1, math.ceil(counts.pairs / _SORT_BLOCK_PAIRS))
        ordered = pairs.repartition(sort_blocks).sort(SPREAD_KEY).drop_columns([SPREAD_KEY])
        ordered.context.execution_options.preserve_order = True  # this dataset's own context
        # No CPU reserved for the write tasks: an on-demand head offers none
        # (cluster/aws.yaml), and they only encode and store what the actors made.
        ordered.write_parquet(_writable(output_dir), ray_remote_args={"num_cpus": 0})
    result = AnnotationResult(counts, time.perf_counter() - start, output_dir)
    logger.info("round %d: %s → %s", round_index, result.summary(), output_dir)
    return result


def annotate_documents_locally(
    documents: Iterable[Mapping],
    model_path: str,
    round_index: int = 0,
    config: AnnotationConfig | None = None,
    documents_per_encode: int = 1,
    output_dir: str | None = None,
) -> tuple[list[dict], AnnotationResult]:
    """Single-process reference: `documents` are ``{doc_id, sentences}`` mappings.

    `documents_per_encode` documents share one ``encode`` call (1: each document alone).
    Returns the pairs (rows of ``PAIR_SCHEMA``, in document order) and the counts; also
    writes them to `output_dir` as one Parquet file when given.
    """
    config = config or AnnotationConfig()
    if documents_per_encode < 1:
        raise ValueError(f"documents_per_encode must be ≥ 1, got {documents_per_encode}")
    if output_dir is not None:
        _check_output_dir(output_dir)
    start = time.perf_counter()
    annotator = DocumentAnnotator(
        model_path,
        config.idc,
        pooler=config.pooler,
        batch_size=config.encode_batch_size,
        max_seq_length=config.max_seq_length,
        torch_threads=config.torch_threads,
    )
    tables: list[pa.Table] = []
    chunk: list[Mapping] = []

    def flush() -> None:
        rows = annotator.annotate(
            [str(d["doc_id"]) for d in chunk], [list(d["sentences"]) for d in chunk]
        )
        tables.append(pa.Table.from_pylist(rows, schema=DOCUMENT_ANNOTATION_SCHEMA))
        chunk.clear()

    for document in documents:
        chunk.append(document)
        if len(chunk) >= documents_per_encode:
            flush()
    if chunk:
        flush()
    annotated = pa.concat_tables(tables) if tables else DOCUMENT_ANNOTATION_SCHEMA.empty_table()
    pairs = explode_pairs(annotated, round_index)
    if output_dir is not None:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        pq.write_table(pairs, Path(output_dir) / "pairs.parquet")
    result = AnnotationResult(counts_of(annotated), time.perf_counter() - start, output_dir)
    logger.info("round %d (local): %s", round_index, result.summary())
    return pairs.to_pylist(), result
