"""Retrieval: Recall@k and MRR of (query, positive) pairs against a corpus.

The corpus is every distinct positive plus optional distractors; candidates are ranked by
cosine similarity. Ties count against the query (a candidate scoring *equal* to the positive
ranks above it), so a collapsed encoder that gives every sentence the same vector scores
badly instead of perfectly. All metrics are reported × 100.

Built-in task: STS-B test pairs scored ≥ 4 (query = sentence 1, positive = sentence 2), with
the second sentences of the remaining STS-B test pairs as distractors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from distributed_emb.evaluation.senteval_data import StsData

Encoder = Callable[[list[str]], np.ndarray]


@dataclass
class RetrievalTask:
    """Queries, each with one positive; the corpus is the positives plus `distractors`."""

    queries: list[str]
    positives: list[str]
    name: str
    distractors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.queries) != len(self.positives):
            raise ValueError(
                f"{self.name}: {len(self.queries)} queries but {len(self.positives)} positives"
            )
        if not self.queries:
            raise ValueError(f"{self.name}: no queries")

    def corpus(self) -> tuple[list[str], np.ndarray]:
        """(distinct corpus texts, index of each query's positive in them)."""
        texts: dict[str, int] = {}
        for text in list(self.positives) + list(self.distractors):
            texts.setdefault(text, len(texts))
        positive_index = np.array([texts[p] for p in self.positives], dtype=np.int64)
        return list(texts), positive_index


def _normalise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def positive_ranks(
    query_embeddings: np.ndarray,
    corpus_embeddings: np.ndarray,
    positive_index: np.ndarray,
    chunk_size: int = 1024,
) -> np.ndarray:
    """1-based rank of each query's positive among all corpus entries, by cosine.

    rank = 1 + #(other corpus entries with similarity ≥ the positive's): ties are pessimistic.
    """
    queries = _normalise(query_embeddings)  # (q, d)
    corpus = _normalise(corpus_embeddings)  # (c, d)
    positive_index = np.asarray(positive_index, dtype=np.int64)  # (q,)
    if queries.shape[0] != positive_index.shape[0]:
        raise ValueError(f"{queries.shape[0]} queries but {positive_index.shape[0]} positives")
    if positive_index.min() < 0 or positive_index.max() >= corpus.shape[0]:
        raise ValueError("positive_index points outside the corpus")
    ranks = np.empty(queries.shape[0], dtype=np.int64)
    for start in range(0, queries.shape[0], chunk_size):
        stop = min(start + chunk_size, queries.shape[0])
        sims = queries[start:stop] @ corpus.T  # (chunk, c)
        rows = np.arange(stop - start)
        positive_sims = sims[rows, positive_index[start:stop]]  # (chunk,)
        at_least = (sims >= positive_sims[:, None]).sum(axis=1)  # includes the positive itself
        ranks[start:stop] = at_least
    return ranks


def metrics_from_ranks(ranks: np.ndarray, ks: Sequence[int] = (1, 5, 10)) -> dict[str, float]:
    """Recall@k (share of queries whose positive ranks ≤ k) and MRR, × 100."""
    ranks = np.asarray(ranks, dtype=np.float64)
    out = {f"recall@{k}": float(np.mean(ranks <= k) * 100) for k in ks}
    out["mrr"] = float(np.mean(1.0 / ranks) * 100)
    return out


def per_query_from_ranks(
    ranks: np.ndarray, ks: Sequence[int] = (1, 5, 10)
) -> dict[str, list[float]]:
    """Each query's Recall@k (0 or 100) and reciprocal rank × 100, in query order: the values
    :func:`metrics_from_ranks` averages, kept for paired comparisons (evaluation/comparison.py)."""
    ranks = np.asarray(ranks, dtype=np.float64)
    out = {f"recall@{k}": ((ranks <= k) * 100.0).tolist() for k in ks}
    out["mrr"] = (100.0 / ranks).tolist()
    return out


def retrieval_metrics(
    query_embeddings: np.ndarray,
    corpus_embeddings: np.ndarray,
    positive_index: np.ndarray,
    ks: Sequence[int] = (1, 5, 10),
) -> dict[str, float]:
    """Recall@k and MRR (× 100) from embeddings; see :func:`positive_ranks`."""
    ranks = positive_ranks(query_embeddings, corpus_embeddings, positive_index)
    return metrics_from_ranks(ranks, ks)


def evaluate_retrieval(
    encode: Encoder, task: RetrievalTask, ks: Sequence[int] = (1, 5, 10)
) -> dict:
    """Encode queries and corpus in one call and score the task; ``per_query`` holds each
    query's values (:func:`per_query_from_ranks`)."""
    corpus, positive_index = task.corpus()
    embeddings = np.asarray(encode(list(task.queries) + corpus))  # (q + c, d)
    n_queries = len(task.queries)
    ranks = positive_ranks(embeddings[:n_queries], embeddings[n_queries:], positive_index)
    result: dict = metrics_from_ranks(ranks, ks)
    result["n_queries"] = n_queries
    result["n_corpus"] = len(corpus)
    result["per_query"] = per_query_from_ranks(ranks, ks)
    return result


def sts_retrieval_task(data: StsData, threshold: float = 4.0) -> RetrievalTask:
    """Pairs scored ≥ `threshold` become (query, positive); the other pairs' second
    sentences are distractors (minus any text that is already a query or a positive)."""
    keep = data.scores >= threshold
    queries = [s for s, k in zip(data.sentences1, keep, strict=True) if k]
    positives = [s for s, k in zip(data.sentences2, keep, strict=True) if k]
    taken = set(queries) | set(positives)
    distractors = [
        s for s, k in zip(data.sentences2, keep, strict=True) if not k and s not in taken
    ]
    return RetrievalTask(queries, positives, f"{data.name}-score>={threshold:g}", distractors)
