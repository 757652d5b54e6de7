"""Alignment and uniformity of an embedding space (Wang & Isola, ICML 2020).

Both are defined on the unit hypersphere, so embeddings are L2-normalised first:

- alignment  = E_{(x, y) positive pairs} ||f(x) − f(y)||^α          (α = 2; lower is better)
- uniformity = log E_{x, y distinct samples} exp(−t ||f(x) − f(y)||²)  (t = 2; lower is better)

As SimCSE does, positives are STS-B pairs scored ≥ 4 and uniformity runs over every distinct
sentence of the set. The expectation in uniformity is over unordered pairs i < j, as in the
authors' ``torch.pdist`` code.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.special import logsumexp

from distributed_emb.evaluation.senteval_data import StsData

Encoder = Callable[[list[str]], np.ndarray]


def _normalise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def alignment(x: np.ndarray, y: np.ndarray, alpha: float = 2.0) -> float:
    """Mean ||x̂ᵢ − ŷᵢ||^α over rows of two (n, d) arrays of positive pairs."""
    x, y = _normalise(x), _normalise(y)  # (n, d)
    if x.shape != y.shape:
        raise ValueError(f"positive pairs need equal shapes, got {x.shape} and {y.shape}")
    return float(np.mean(np.linalg.norm(x - y, axis=1) ** alpha))


def uniformity(x: np.ndarray, t: float = 2.0, chunk_size: int = 1024) -> float:
    """log of the mean of exp(−t ||x̂ᵢ − x̂ⱼ||²) over all pairs i < j of an (n, d) array."""
    x = _normalise(x)  # (n, d)
    n = x.shape[0]
    if n < 2:
        raise ValueError("uniformity needs at least two embeddings")
    # Per-chunk log-sum-exp keeps exp(−t·d²) from underflowing for well-spread spaces.
    partial_logsums = []
    for start in range(0, n - 1, chunk_size):
        stop = min(start + chunk_size, n - 1)
        block = x[start:stop]  # (b, d)
        squared = np.maximum(2.0 - 2.0 * block @ x.T, 0.0)  # (b, n): ||a−b||² of unit vectors
        rows, cols = np.indices(squared.shape)
        upper = cols > rows + start  # keep j > i only
        partial_logsums.append(logsumexp(-t * squared[upper]))
    n_pairs = n * (n - 1) / 2
    return float(logsumexp(partial_logsums) - np.log(n_pairs))


def sts_geometry(encode: Encoder, data: StsData, threshold: float = 4.0) -> dict[str, float]:
    """Alignment on pairs scored ≥ `threshold`, uniformity on all distinct sentences."""
    keep = data.scores >= threshold
    if keep.sum() == 0:
        raise ValueError(f"{data.name}: no pairs scored >= {threshold}")
    sentences = list(dict.fromkeys(data.sentences1 + data.sentences2))
    row = {s: i for i, s in enumerate(sentences)}
    embeddings = np.asarray(encode(sentences))  # (m, d)
    first = embeddings[[row[s] for s, k in zip(data.sentences1, keep, strict=True) if k]]
    second = embeddings[[row[s] for s, k in zip(data.sentences2, keep, strict=True) if k]]
    return {
        "alignment": alignment(first, second),
        "uniformity": uniformity(embeddings),
        "n_positive_pairs": int(keep.sum()),
        "n_sentences": len(sentences),
    }
