"""What the MCR² head trains on: sentences with cluster ids, and similar pairs.

Sentences come through the project's document reader (``data/documents.py``), whose id column
is the user's cluster column: a document id (the default: every shipped document, the 97
Wikipedia articles and the 300 Lee news documents), an IDC cluster id, or a label (point
``id_column`` at it; ``text_column`` rows are split into sentences and share their row's
cluster). Rows with the same id form one cluster.

Similar pairs come from
- ``idc`` (default, no labels): InfoCSE's intra-document clustering (``infocse/idc.py``) on the
  frozen encoder's vectors of each document's sentences; pairs inside a cluster (built in
  ``mcr2/pipeline.py`` once the vectors exist);
- ``sts``: STS-B (and optionally SICK-R) train pairs with gold score ≥ ``min_score``;
- ``file``: a JSONL/Parquet/HF table with anchor and positive columns (e.g. InfoCSE output),
  read by ``data/corpus.py`` (bad rows skipped and counted);
- ``dropout``: two dropout views of training sentences (built in ``mcr2/embeddings.py``);
- ``none``: no pair term.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import Field

from distributed_emb.checks import require
from distributed_emb.data.corpus import read_rows
from distributed_emb.data.documents import DocumentsConfig, read_documents_locally
from distributed_emb.data.held_out import HeldOutConfig, held_out_split
from distributed_emb.evaluation.senteval_data import read_sick_relatedness, read_sts_benchmark
from distributed_emb.infocse.idc import IDCConfig, intra_document_clusters
from distributed_emb.mcr2.assignments import cluster_ids_from_column
from distributed_emb.paths import shipped_corpus, shipped_senteval_dir
from distributed_emb.settings import Seed, section

log = logging.getLogger(__name__)

SHIPPED_DOCUMENTS = (
    shipped_corpus("wiki_documents.jsonl"),
    shipped_corpus("lee_documents.jsonl"),
)


@section
class SentencesConfig:
    # The shipped wiki_documents.jsonl is 97 Wikipedia articles, 17,891 sentences (those of
    # wiki_sentences.txt); lee_documents.jsonl is 300 news documents.
    paths: Annotated[
        list[str] | None,
        Field(
            description="the document corpora the head trains on (data/documents.py: JSONL, "
            "Parquet, Hugging Face datasets, s3:// or gs:// URIs, globs); null: every shipped "
            "document corpus (Wikipedia articles and Lee news)"
        ),
    ] = None
    id_column: Annotated[
        str,
        Field(
            description="the cluster column: a document id, IDC cluster id or label; rows "
            "with the same value are one cluster of R_c"
        ),
    ] = "id"
    sentences_column: Annotated[
        str, Field(description="the field holding a row's list of sentences (used when present)")
    ] = "sentences"
    text_column: Annotated[
        str,
        Field(
            description="the field holding a row's text, split into sentences when it has no "
            "sentences list"
        ),
    ] = "text"
    hf_split: Annotated[str, Field(description="the split of a Hugging Face dataset")] = "train"
    # One-sentence documents are kept: a singleton cluster adds a constant to R_c, no harm.
    min_sentences: Annotated[
        int, Field(ge=1, description="documents with fewer sentences are dropped and counted")
    ] = 1
    # All by default: a head trained on more of the corpus generalises better, and the vectors
    # are cached after one pass.
    max_per_cluster: Annotated[
        int | None,
        Field(
            ge=1,
            description="sample at most this many sentences per cluster (with seed); null: all",
        ),
    ] = None
    max_sentences: Annotated[
        int | None,
        Field(
            ge=1,
            description="sample at most this many sentences overall, after the per-cluster cap; "
            "null: all",
        ),
    ] = None
    seed: Annotated[Seed, Field(description="seed of the sentence sampling of both caps")] = 0

    def documents(self) -> DocumentsConfig:
        return DocumentsConfig(
            paths=list(self.paths) if self.paths else list(SHIPPED_DOCUMENTS),
            id_column=self.id_column,
            sentences_column=self.sentences_column,
            text_column=self.text_column,
            hf_split=self.hf_split,
            min_sentences=self.min_sentences,
        )


@section
class PairsConfig:
    # See the module docstring for each source.
    source: Annotated[
        Literal["idc", "sts", "file", "dropout", "none"],
        Field(
            description="the similar pairs of the pair term: idc (label-free, InfoCSE's "
            "intra-document clustering of the training documents), sts (STS train pairs with "
            "gold score >= min_score), file (a pairs table), dropout (two dropout views of "
            "training sentences), none (no pair term)"
        ),
    ] = "idc"
    # IDC's graph over each document's sentences: j among i's top_k neighbours or i among j's.
    idc_top_k: Annotated[
        int,
        Field(ge=1, description="idc: the nearest neighbours linked to each sentence"),
    ] = 1
    idc_mutual: Annotated[
        bool,
        Field(
            description="idc: link i and j only when each is among the other's top_k (mutual "
            "kNN); false: when either is"
        ),
    ] = False
    idc_max_pairs_per_cluster: Annotated[
        int | None,
        Field(ge=1, description="idc: at most this many pairs per IDC cluster; null: all"),
    ] = 10
    senteval_dir: Annotated[
        str | None,
        Field(
            description="sts: a SentEval data/downstream directory holding the STS sets; null: "
            "the shipped STS-B"
        ),
    ] = None
    # Not empty when source is sts: validate().
    sts_sets: Annotated[
        list[Literal["STSB", "SICK"]],
        Field(description="sts: the sets whose train pairs are read (STSB, SICK)"),
    ] = field(default_factory=lambda: ["STSB"])
    # STS-B and SICK gold scores run from 0 to 5: a bound outside selects nothing or all.
    min_score: Annotated[
        float,
        Field(ge=0, le=5, description="sts: the least gold score of a pair kept"),
    ] = 4.0
    # Required when source is file: validate().
    path: Annotated[
        str | None,
        Field(
            description="file: the pairs table (JSONL, Parquet or a Hugging Face dataset directory)"
        ),
    ] = None
    anchor_column: Annotated[str, Field(description="file: the anchor field")] = "anchor"
    positive_column: Annotated[str, Field(description="file: the positive field")] = "positive"
    max_pairs: Annotated[
        int | None,
        Field(ge=1, description="any source: sample at most this many pairs; null: all"),
    ] = None
    seed: Annotated[
        Seed, Field(description="seed of the pair sampling (max_pairs, IDC's caps)")
    ] = 0

    def validate(self) -> None:
        """What the declarations cannot say: the settings a source needs are given."""
        require(
            self.source != "file" or bool(self.path),
            "pairs.path",
            "is required when pairs.source is 'file'",
        )
        require(
            self.source != "sts" or bool(self.sts_sets),
            "pairs.sts_sets",
            "is empty; pairs.source 'sts' reads at least one of STSB, SICK",
        )


@dataclass
class TrainingSentences:
    texts: list[str]
    cluster_ids: np.ndarray  # (n,) int64, 0..k−1
    cluster_names: list  # the id column's value of each cluster
    summary: str
    # The held-out documents ({doc_id, sentences}, one row per id, in file order): never in
    # texts, cluster_ids or cluster_names; the run's document-level yardstick.
    held_out: list[dict] = field(default_factory=list)

    @property
    def num_clusters(self) -> int:
        return len(self.cluster_names)

    def write_parquet(self, path: str | os.PathLike) -> Path:
        """The sentences and their cluster ids as a Parquet file (columns ``text``,
        ``cluster_id``): the corpus of an end-to-end fine-tuning run (jobs/finetune_mcr2.py,
        ``data.group_column=cluster_id``), so it trains on exactly the heads' data."""
        import pyarrow as pa  # startup
        import pyarrow.parquet as pq

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        table = pa.table(
            {"text": self.texts, "cluster_id": np.asarray(self.cluster_ids, dtype=np.int64)}
        )
        staging = path.with_name(f".{path.name}.tmp")
        pq.write_table(table, staging)
        staging.replace(path)  # a crash mid-write leaves no half file under the real name
        return path


@dataclass
class SimilarPairs:
    anchors: list[str]
    positives: list[str]
    summary: str

    def __len__(self) -> int:
        return len(self.anchors)


def split_documents(
    documents: list[dict], heldout: HeldOutConfig | None
) -> tuple[dict[str, list[str]], list[dict]]:
    """({id: its sentences} to train on, the held-out documents as {doc_id, sentences} rows):
    the rows of one id joined in file order, each id held out or not by
    ``held_out_split(id, heldout.fraction, heldout.seed)`` alone (None: nothing held out), so
    the two parts share no id, hence no cluster and no sentence of a held-out document."""
    by_id: dict[str, list[str]] = {}
    for document in documents:
        by_id.setdefault(document["doc_id"], []).extend(document["sentences"])
    if heldout is None or heldout.fraction == 0:
        return by_id, []
    held = {d for d in by_id if held_out_split(d, heldout.fraction, heldout.seed) is not None}
    training = {doc_id: s for doc_id, s in by_id.items() if doc_id not in held}
    rows = [{"doc_id": doc_id, "sentences": s} for doc_id, s in by_id.items() if doc_id in held]
    return training, rows


def load_training_sentences(
    config: SentencesConfig, heldout: HeldOutConfig | None = None
) -> TrainingSentences:
    """Sentences and their cluster ids, with per-cluster and overall caps applied, the
    documents `heldout` holds out left out (kept in ``held_out``; None: none held out)."""
    documents_config = config.documents()
    documents, report = read_documents_locally(documents_config, log=False)
    if not documents:
        raise ValueError(f"no usable documents in {documents_config.paths}: {report.summary()}")
    by_cluster, held_rows = split_documents(documents, heldout)
    if not by_cluster:
        raise ValueError(
            f"every document of {documents_config.paths} is held out "
            f"(heldout.fraction={heldout.fraction}): nothing to train on; lower heldout.fraction"
        )

    rng = np.random.default_rng(config.seed)
    texts: list[str] = []
    ids: list[str] = []
    capped = 0
    for doc_id, sentences in by_cluster.items():
        if config.max_per_cluster is not None and len(sentences) > config.max_per_cluster:
            keep = np.sort(rng.choice(len(sentences), config.max_per_cluster, replace=False))
            capped += len(sentences) - len(keep)
            sentences = [sentences[i] for i in keep]
        texts.extend(sentences)
        ids.extend([doc_id] * len(sentences))
    if config.max_sentences is not None and len(texts) > config.max_sentences:
        keep = np.sort(rng.choice(len(texts), config.max_sentences, replace=False))
        capped += len(texts) - len(keep)
        texts, ids = [texts[i] for i in keep], [ids[i] for i in keep]

    cluster_ids, names = cluster_ids_from_column(ids, column=config.id_column)
    splits = [held_out_split(r["doc_id"], heldout.fraction, heldout.seed) for r in held_rows]
    summary = (
        f"{len(texts)} sentences in {len(names)} clusters (column "
        f"{config.id_column!r}); {capped} sentences left out by the caps; "
        f"{len(held_rows)} documents held out (dev {splits.count('dev')}, test "
        f"{splits.count('test')}); {report.summary()}"
    )
    return TrainingSentences(texts, cluster_ids, names, summary, held_rows)


def _sample_pairs(anchors, positives, config: PairsConfig, origin: str) -> SimilarPairs:
    total = len(anchors)
    if config.max_pairs is not None and total > config.max_pairs:
        keep = np.sort(np.random.default_rng(config.seed).choice(total, config.max_pairs, False))
        anchors = [anchors[i] for i in keep]
        positives = [positives[i] for i in keep]
    return SimilarPairs(list(anchors), list(positives), f"{len(anchors)} pairs from {origin}")


def load_sts_pairs(config: PairsConfig) -> SimilarPairs:
    """Train-split pairs of the chosen STS sets whose gold score is ≥ ``min_score``."""

    senteval_dir = config.senteval_dir or shipped_senteval_dir()
    readers = {"STSB": read_sts_benchmark, "SICK": read_sick_relatedness}
    anchors: list[str] = []
    positives: list[str] = []
    parts = []
    for name in config.sts_sets:
        data = readers[name](senteval_dir, "train")
        keep = np.flatnonzero(data.scores >= config.min_score)
        anchors += [data.sentences1[i] for i in keep]
        positives += [data.sentences2[i] for i in keep]
        parts.append(f"{name} train {len(keep)}/{len(data)}")
    if not anchors:
        raise ValueError(
            f"no STS train pairs with score ≥ {config.min_score} in {senteval_dir} "
            f"({', '.join(parts)}); lower pairs.min_score"
        )
    origin = f"{', '.join(parts)} with score ≥ {config.min_score}"
    return _sample_pairs(anchors, positives, config, origin)


def load_pairs_file(config: PairsConfig) -> SimilarPairs:
    columns = [config.anchor_column, config.positive_column]
    rows, report = read_rows(config.path, columns=columns)
    origin = f"{config.path} ({report.summary()})"
    return _sample_pairs(rows[columns[0]], rows[columns[1]], config, origin)


def load_similar_pairs(config: PairsConfig) -> SimilarPairs | None:
    """The configured text pairs (None for ``none``, and for ``dropout`` and ``idc``, whose
    pairs come from the vectors)."""
    config.validate()
    if config.source == "sts":
        return load_sts_pairs(config)
    if config.source == "file":
        return load_pairs_file(config)
    return None


def idc_pairs(
    texts: list[str],
    vectors: np.ndarray,
    cluster_ids: np.ndarray,
    config: PairsConfig,
) -> SimilarPairs:
    """Label-free similar pairs: InfoCSE's intra-document clustering over each document's
    (each cluster id's) sentence vectors, pairs inside each IDC cluster.

    texts: n sentences; vectors: (n, D) their frozen-encoder vectors; cluster_ids: (n,) the
    document of each. Documents are seeded by their cluster id, so the pairs do not depend on
    the order of the documents."""

    idc = IDCConfig(
        top_k=config.idc_top_k,
        mutual=config.idc_mutual,
        max_pairs_per_cluster=config.idc_max_pairs_per_cluster,
        seed=config.seed,
    )
    anchors: list[str] = []
    positives: list[str] = []
    documents = 0
    for cluster in np.unique(cluster_ids):
        members = np.flatnonzero(cluster_ids == cluster)  # (m,)
        if len(members) < 2:
            continue
        documents += 1
        result = intra_document_clusters(
            vectors[members], idc, seed=config.seed * 1_000_003 + int(cluster)
        )
        for a, b in result.pairs:  # (P, 2) indices into members
            anchors.append(texts[members[a]])
            positives.append(texts[members[b]])
    if not anchors:
        raise ValueError(
            "IDC found no pairs: every document has fewer than 2 sentences; "
            "use pairs.source=dropout or none"
        )
    origin = (
        f"IDC (top_k={config.idc_top_k}, mutual={config.idc_mutual}, at most "
        f"{config.idc_max_pairs_per_cluster} per cluster) inside {documents} documents"
    )
    return _sample_pairs(anchors, positives, config, origin)
