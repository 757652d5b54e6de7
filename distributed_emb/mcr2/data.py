"""What the MCR² head trains on: sentences with cluster ids, and similar pairs.

Sentences come through the project's document reader (``data/documents.py``), whose id column
is the user's cluster column: a document id (the default, shipped Wikipedia articles), an IDC
cluster id, or a label (point ``id_column`` at it; ``text_column`` rows are split into
sentences and share their row's cluster). Rows with the same id form one cluster.

Similar pairs come from
- ``sts``: STS-B (and optionally SICK-R) train pairs with gold score ≥ ``min_score``;
- ``file``: a JSONL/Parquet/HF table with anchor and positive columns (e.g. InfoCSE output),
  read by ``data/corpus.py`` (bad rows skipped and counted);
- ``dropout``: two dropout views of training sentences (built in ``mcr2/embeddings.py``);
- ``none``: no pair term.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from distributed_emb.data.documents import DocumentsConfig, read_documents_locally
from distributed_emb.mcr2.assignments import cluster_ids_from_column
from distributed_emb.paths import shipped_corpus, shipped_senteval_dir

log = logging.getLogger(__name__)


@dataclass
class SentencesConfig:
    # Document sources for data/documents.py (JSONL, Parquet, HF); None: the shipped
    # wiki_documents.jsonl (97 Wikipedia articles).
    paths: list[str] | None = None
    id_column: str = "id"  # the cluster column: document id, IDC cluster id, label, ...
    sentences_column: str = "sentences"  # a list of sentences per row ...
    text_column: str = "text"  # ... or a text, split into sentences
    hf_split: str = "train"
    # One-sentence documents are kept: a singleton cluster adds a constant to R_c, no harm.
    min_sentences: int = 1
    # Long documents would dominate R_c and the encoding time; sample at most this many
    # sentences per cluster (None: all).
    max_per_cluster: int | None = 64
    max_sentences: int | None = None  # overall cap after the per-cluster one (None: all)
    seed: int = 0

    def documents(self) -> DocumentsConfig:
        return DocumentsConfig(
            paths=list(self.paths) if self.paths else [shipped_corpus("wiki_documents.jsonl")],
            id_column=self.id_column,
            sentences_column=self.sentences_column,
            text_column=self.text_column,
            hf_split=self.hf_split,
            min_sentences=self.min_sentences,
        )

    def validate(self) -> None:
        self.documents().validate()
        for name in ("max_per_cluster", "max_sentences"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"sentences.{name} must be ≥ 1 or null, got {value}")


@dataclass
class PairsConfig:
    source: Literal["sts", "file", "dropout", "none"] = "sts"
    # sts: a SentEval data/downstream dir (None: the shipped STS-B), which sets, which score.
    senteval_dir: str | None = None
    sts_sets: list[Literal["STSB", "SICK"]] = field(default_factory=lambda: ["STSB"])
    min_score: float = 4.0
    # file: a pairs table (JSONL / Parquet / HF dataset dir).
    path: str | None = None
    anchor_column: str = "anchor"
    positive_column: str = "positive"
    # Any source: at most this many pairs, sampled with `seed` (None: all).
    max_pairs: int | None = None
    seed: int = 0

    def validate(self) -> None:
        if self.source == "file" and not self.path:
            raise ValueError("pairs.path is required when pairs.source is 'file'")
        if self.source == "sts" and not self.sts_sets:
            raise ValueError("pairs.sts_sets is empty")
        if self.max_pairs is not None and self.max_pairs < 1:
            raise ValueError(f"pairs.max_pairs must be ≥ 1 or null, got {self.max_pairs}")


@dataclass
class TrainingSentences:
    texts: list[str]
    cluster_ids: np.ndarray  # (n,) int64, 0..k−1
    cluster_names: list  # the id column's value of each cluster
    summary: str

    @property
    def num_clusters(self) -> int:
        return len(self.cluster_names)


@dataclass
class SimilarPairs:
    anchors: list[str]
    positives: list[str]
    summary: str

    def __len__(self) -> int:
        return len(self.anchors)


def load_training_sentences(config: SentencesConfig) -> TrainingSentences:
    """Sentences and their cluster ids, with per-cluster and overall caps applied."""
    config.validate()
    documents_config = config.documents()
    documents, report = read_documents_locally(documents_config, log=False)
    if not documents:
        raise ValueError(f"no usable documents in {documents_config.paths}: {report.summary()}")
    by_cluster: dict[str, list[str]] = {}
    for document in documents:
        by_cluster.setdefault(document["doc_id"], []).extend(document["sentences"])

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
    summary = (
        f"{len(texts)} sentences in {len(names)} clusters (column "
        f"{config.id_column!r}); {capped} sentences left out by the caps; "
        f"{report.summary()}"
    )
    return TrainingSentences(texts, cluster_ids, names, summary)


def _sample_pairs(anchors, positives, config: PairsConfig, origin: str) -> SimilarPairs:
    total = len(anchors)
    if config.max_pairs is not None and total > config.max_pairs:
        keep = np.sort(np.random.default_rng(config.seed).choice(total, config.max_pairs, False))
        anchors = [anchors[i] for i in keep]
        positives = [positives[i] for i in keep]
    return SimilarPairs(list(anchors), list(positives), f"{len(anchors)} pairs from {origin}")


def load_sts_pairs(config: PairsConfig) -> SimilarPairs:
    """Train-split pairs of the chosen STS sets whose gold score is ≥ ``min_score``."""
    from distributed_emb.evaluation.senteval_data import (
        read_sick_relatedness,
        read_sts_benchmark,
    )

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
    from distributed_emb.data.corpus import read_rows

    columns = [config.anchor_column, config.positive_column]
    rows, report = read_rows(config.path, columns=columns)
    origin = f"{config.path} ({report.summary()})"
    return _sample_pairs(rows[columns[0]], rows[columns[1]], config, origin)


def load_similar_pairs(config: PairsConfig) -> SimilarPairs | None:
    """The configured pairs (None for ``none`` and ``dropout``, which has no text pairs)."""
    config.validate()
    if config.source == "sts":
        return load_sts_pairs(config)
    if config.source == "file":
        return load_pairs_file(config)
    return None
