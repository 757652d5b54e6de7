"""In-domain retrieval on held-out documents: the InfoCSE paper's kind of metric.

Documents are split by document (never by sentence) into training and held-out sets by
data/held_out.py (a hash of (seed, doc_id): the same documents in every run with the same
seed).

The task (:class:`SameDocumentTask`): every held-out sentence is a query; its candidates are
all *other* held-out sentences; the relevant ones are the sentences of its own document.
A query's rank is that of its best-ranked relevant candidate, ties counted against it (as in
evaluation/retrieval.py: a collapsed encoder scores badly, not perfectly):

    rank(i) = 1 + #{j ≠ i, doc(j) ≠ doc(i), cos(i, j) ≥ max_{k ≠ i, doc(k) = doc(i)} cos(i, k)}

Recall@k is the share of queries with rank ≤ k, MRR the mean of 1/rank, all × 100
(:func:`~distributed_emb.evaluation.retrieval.metrics_from_ranks`). Each held-out document
contributes at most `max_sentences_per_document` sentences (its first ones), so a few long
Wikipedia articles do not make up most of the queries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from distributed_emb.evaluation.retrieval import metrics_from_ranks

Encoder = Callable[[list[str]], np.ndarray]


@dataclass
class SameDocumentTask:
    """Held-out sentences and the document (0..D−1) each belongs to."""

    sentences: list[str]
    doc_index: np.ndarray  # (n,) int
    num_documents: int
    name: str = "heldout-same-document"

    def __post_init__(self) -> None:
        self.doc_index = np.asarray(self.doc_index, dtype=np.int64)
        if len(self.sentences) != len(self.doc_index):
            raise ValueError(
                f"{self.name}: {len(self.sentences)} sentences but {len(self.doc_index)} labels"
            )
        counts = np.bincount(self.doc_index, minlength=self.num_documents)
        if len(self.sentences) == 0 or (counts < 2).any():
            raise ValueError(f"{self.name}: every document needs at least 2 sentences")

    @classmethod
    def from_documents(
        cls,
        documents: Iterable[Mapping],
        max_sentences_per_document: int | None = 16,
        name: str = "heldout-same-document",
    ) -> SameDocumentTask:
        """From ``{doc_id, sentences}`` rows, in doc_id order; documents with fewer than 2
        (distinct, non-empty) sentences are left out: a query needs a relevant candidate."""
        sentences: list[str] = []
        labels: list[int] = []
        seen: set[str] = set()  # a sentence repeated across documents would be ambiguous
        for document in sorted(documents, key=lambda d: str(d["doc_id"])):
            kept = []
            for s in document["sentences"]:
                s = str(s).strip()
                if s and s not in seen and s not in kept:
                    kept.append(s)
                if max_sentences_per_document and len(kept) >= max_sentences_per_document:
                    break
            if len(kept) < 2:
                continue
            seen.update(kept)
            label = labels[-1] + 1 if labels else 0
            sentences.extend(kept)
            labels.extend([label] * len(kept))
        return cls(sentences, np.array(labels), (labels[-1] + 1) if labels else 0, name)


def same_document_ranks(
    embeddings: np.ndarray, doc_index: np.ndarray, chunk_size: int = 1024
) -> np.ndarray:
    """1-based rank of each row's best same-document neighbour among all other rows (cosine,
    ties pessimistic; see the module docstring). embeddings: (n, d); doc_index: (n,)."""
    x = np.asarray(embeddings, dtype=np.float64)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)  # (n, d)
    doc_index = np.asarray(doc_index, dtype=np.int64)
    n = x.shape[0]
    if doc_index.shape != (n,):
        raise ValueError(f"{n} embeddings but {doc_index.shape[0]} document labels")
    ranks = np.empty(n, dtype=np.int64)
    for start in range(0, n, chunk_size):
        stop = min(start + chunk_size, n)
        rows = np.arange(start, stop)
        sims = x[start:stop] @ x.T  # (chunk, n)
        same = doc_index[start:stop, None] == doc_index[None, :]  # (chunk, n)
        same[rows - start, rows] = False  # a sentence is not its own candidate
        if not same.any(axis=1).all():
            raise ValueError("a query has no other sentence of its document")
        best_relevant = np.where(same, sims, -np.inf).max(axis=1)  # (chunk,)
        other = doc_index[start:stop, None] != doc_index[None, :]  # never includes itself
        ranks[start:stop] = 1 + ((sims >= best_relevant[:, None]) & other).sum(axis=1)
    return ranks


def evaluate_same_document(
    encode: Encoder, task: SameDocumentTask, ks: Sequence[int] = (1, 5, 10)
) -> dict[str, float]:
    """Recall@k and MRR (× 100) of `encode` on `task`, with the query and document counts."""
    embeddings = np.asarray(encode(list(task.sentences)))  # (n, d)
    result: dict[str, float] = metrics_from_ranks(
        same_document_ranks(embeddings, task.doc_index), ks
    )
    result["n_queries"] = len(task.sentences)
    result["n_documents"] = task.num_documents
    return result
