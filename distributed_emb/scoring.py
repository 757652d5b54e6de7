"""Embedding pairs scored against gold similarities: the row cosine of two (n, d) arrays and
Spearman × 100, the unit of the papers' tables.

The one implementation, below model/ and evaluation/: every STS number (evaluation/sts.py), the
serving check of an export (model/serving_check.py), the MCR² heads' dev scores.
"""

from __future__ import annotations

import numpy as np


def pair_cosines(embeddings1: np.ndarray, embeddings2: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two (n, d) arrays → (n,).

    A zero vector gives NaN cosine; SentEval maps it to 0 (``np.nan_to_num``), and so do we.
    """
    e1 = np.asarray(embeddings1, dtype=np.float64)  # (n, d)
    e2 = np.asarray(embeddings2, dtype=np.float64)  # (n, d)
    if e1.ndim != 2 or e1.shape != e2.shape:
        raise ValueError(
            f"embeddings must be two (n, d) arrays of the same shape, got {e1.shape} and {e2.shape}"
        )
    dots = np.einsum("nd,nd->n", e1, e2)  # (n,)
    norms = np.linalg.norm(e1, axis=1) * np.linalg.norm(e2, axis=1)  # (n,)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.nan_to_num(dots / norms)


def spearman_x100(system_scores: np.ndarray, gold_scores: np.ndarray) -> float:
    """Spearman rank correlation × 100 (the unit of the papers' tables)."""
    system_scores = np.asarray(system_scores, dtype=np.float64)
    gold_scores = np.asarray(gold_scores, dtype=np.float64)
    if system_scores.shape != gold_scores.shape or system_scores.ndim != 1:
        raise ValueError(
            f"need two 1-D arrays of equal length, got {system_scores.shape} and "
            f"{gold_scores.shape}"
        )
    if len(system_scores) < 2:
        raise ValueError("Spearman correlation needs at least two pairs")
    # Imported here: scipy.stats costs 0.6 s of CPU to import, and every Train worker and job
    # driver imports this module (through evaluation/sts.py) while only those that score use it.
    from scipy.stats import spearmanr

    return float(spearmanr(system_scores, gold_scores).statistic) * 100.0


def spearman_of_embeddings(
    embeddings1: np.ndarray, embeddings2: np.ndarray, scores: np.ndarray
) -> float:
    """Spearman × 100 between the pairs' cosine similarities and the gold `scores`."""
    return spearman_x100(pair_cosines(embeddings1, embeddings2), scores)
