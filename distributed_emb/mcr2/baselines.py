"""Training-free projections to the same sizes as the MCR² heads, for the comparison table.

Each is fit on the same training embeddings the heads see:
- ``pca``: principal components (mean-centred, not whitened), scikit-learn ``PCA``;
- ``pca_whiten``: the same components, each scaled to unit variance (``PCA(whiten=True)``;
  BERT-whitening, Su et al. 2021, arXiv:2103.15316, is this map cut to k dims);
- ``random``: a Gaussian random projection (Johnson–Lindenstrauss), scikit-learn
  ``GaussianRandomProjection``;
- ``full``: the uncompressed encoder vectors (identity).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from sklearn.decomposition import PCA
from sklearn.random_projection import GaussianRandomProjection

Projection = Callable[[np.ndarray], np.ndarray]


def fit_pca_model(train: np.ndarray, dim: int, seed: int = 0, whiten: bool = False) -> PCA:
    """scikit-learn PCA of `train` (n, D) to `dim` components (``mean_``, ``components_``):
    the ``pca`` baselines, and the MCR² head's starting point (model/compression_head.py)."""
    if dim > min(train.shape):
        raise ValueError(
            f"PCA to {dim} dims needs at least {dim} training vectors of ≥ {dim} dims; "
            f"got {train.shape}"
        )
    return PCA(n_components=dim, whiten=whiten, random_state=seed).fit(train)


def fit_pca(train: np.ndarray, dim: int, seed: int = 0, whiten: bool = False) -> Projection:
    pca = fit_pca_model(train, dim, seed, whiten)
    return lambda x: pca.transform(x).astype(np.float32)  # (m, dim)


def fit_random_projection(train: np.ndarray, dim: int, seed: int = 0) -> Projection:
    projection = GaussianRandomProjection(n_components=dim, random_state=seed).fit(train)
    return lambda x: projection.transform(x).astype(np.float32)  # (m, dim)


def identity(x: np.ndarray) -> np.ndarray:
    return x


def fit_baseline(name: str, train: np.ndarray, dim: int, seed: int = 0) -> Projection:
    if name == "pca":
        return fit_pca(train, dim, seed)
    if name == "pca_whiten":
        return fit_pca(train, dim, seed, whiten=True)
    if name == "random":
        return fit_random_projection(train, dim, seed)
    if name == "full":
        return identity
    raise ValueError(f"unknown baseline {name!r}; expected pca, pca_whiten, random or full")
