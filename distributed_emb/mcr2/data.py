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
from typing import Literal

import numpy as np

from distributed_emb.config import require_range, require_seed
from distributed_emb.data.corpus import read_rows
from distributed_emb.data.documents import DocumentsConfig, read_documents_locally
from distributed_emb.evaluation.senteval_data import read_sick_relatedness, read_sts_benchmark
from distributed_emb.infocse.idc import IDCConfig, intra_document_clusters
from distributed_emb.mcr2.assignments import cluster_ids_from_column
from distributed_emb.paths import shipped_corpus, shipped_senteval_dir

log = logging.getLogger(__name__)

SHIPPED_DOCUMENTS = (
    shipped_corpus("wiki_documents.jsonl"),
    shipped_corpus("lee_documents.jsonl"),
)


@dataclass
class SentencesConfig:
    # Document sources for data/documents.py (JSONL, Parquet, HF); None: every shipped
    # document corpus, wiki_documents.jsonl (97 Wikipedia articles, 17,891 sentences, the
    # sentences of wiki_sentences.txt) and lee_documents.jsonl (300 news documents).
    paths: list[str] | None = None
    id_column: str = "id"  # the cluster column: document id, IDC cluster id, label, ...
    sentences_column: str = "sentences"  # a list of sentences per row ...
    text_column: str = "text"  # ... or a text, split into sentences
    hf_split: str = "train"
    # One-sentence documents are kept: a singleton cluster adds a constant to R_c, no harm.
    min_sentences: int = 1
    # Sample at most this many sentences per cluster (None: all, the default: a head trained
    # on more of the corpus generalises better, and the vectors are cached after one pass).
    max_per_cluster: int | None = None
    max_sentences: int | None = None  # overall cap after the per-cluster one (None: all)
    seed: int = 0

    def documents(self) -> DocumentsConfig:
        return DocumentsConfig(
            paths=list(self.paths) if self.paths else list(SHIPPED_DOCUMENTS),
            id_column=self.id_column,
            sentences_column=self.sentences_column,
            text_column=self.text_column,
            hf_split=self.hf_split,
            min_sentences=self.min_sentences,
        )

    def validate(self) -> None:
        self.documents().validate()
        for name in ("max_per_cluster", "max_sentences"):
            require_range(getattr(self, name), f"sentences.{name}", 1, allow_none=True)


@dataclass
class PairsConfig:
    # idc: label-free pairs from the training documents (the default); sts: STS train pairs
    # with gold score ≥ min_score (labels); file; dropout; none. See the module docstring.
    source: Literal["idc", "sts", "file", "dropout", "none"] = "idc"
    # idc: InfoCSE's IDC graph (j among i's top_k neighbours or i among j's, ``mutual``: both)
    # over each document's sentences; at most this many pairs per cluster (None: all).
    idc_top_k: int = 1
    idc_mutual: bool = False
    idc_max_pairs_per_cluster: int | None = 10
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
        require_range(self.idc_top_k, "pairs.idc_top_k", 1)
        cap = self.idc_max_pairs_per_cluster
        require_range(cap, "pairs.idc_max_pairs_per_cluster", 1, allow_none=True)
        require_range(self.max_pairs, "pairs.max_pairs", 1, allow_none=True)
        require_seed(self.seed, "pairs.seed")


@dataclass
class TrainingSentences:
    texts: list[str]
    cluster_ids: np.ndarray  # (n,) int64, 0..k−1
    cluster_names: list  # the id column's value of each cluster
    summary: str

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
