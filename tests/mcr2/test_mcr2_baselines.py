"""PCA, whitened PCA and random-projection baselines against their plain definitions."""

from __future__ import annotations

import numpy as np
import pytest

from distributed_emb.mcr2.baselines import fit_baseline


def test_pca_projects_centred_vectors_onto_the_top_eigenvectors():
    rng = np.random.default_rng(0)
    train = rng.standard_normal((200, 6)) * np.array([5.0, 3.0, 2.0, 1.0, 0.5, 0.1])
    project = fit_baseline("pca", train, 2)
    centred = train - train.mean(0)
    eigenvalues, eigenvectors = np.linalg.eigh(centred.T @ centred)
    top = eigenvectors[:, np.argsort(eigenvalues)[::-1][:2]]  # (6, 2)
    expected = centred @ top
    got = project(train)
    # Eigenvector signs are arbitrary: compare column by column up to sign.
    for j in range(2):
        sign = np.sign(got[:, j] @ expected[:, j])
        np.testing.assert_allclose(sign * got[:, j], expected[:, j], rtol=1e-4, atol=1e-4)


def test_whitened_pca_is_pca_scaled_to_unit_variance_per_component():
    rng = np.random.default_rng(2)
    train = rng.standard_normal((300, 5)) @ rng.standard_normal((5, 5))
    centred = train - train.mean(0)
    eigenvalues, eigenvectors = np.linalg.eigh(centred.T @ centred / (len(train) - 1))
    order = np.argsort(eigenvalues)[::-1][:3]
    expected = centred @ eigenvectors[:, order] / np.sqrt(eigenvalues[order])  # (300, 3)
    got = fit_baseline("pca_whiten", train, 3)(train)
    np.testing.assert_allclose(np.cov(got.T), np.eye(3), atol=1e-4)  # white on its data
    for j in range(3):
        sign = np.sign(got[:, j] @ expected[:, j])
        np.testing.assert_allclose(sign * got[:, j], expected[:, j], rtol=1e-4, atol=1e-4)


def test_random_projection_is_a_fixed_linear_map_that_keeps_distances_roughly():
    rng = np.random.default_rng(1)
    train = rng.standard_normal((50, 300))
    project = fit_baseline("random", train, 200, seed=3)
    x = rng.standard_normal((20, 300))
    np.testing.assert_allclose(project(2 * x), 2 * project(x), rtol=1e-4, atol=1e-4)
    ratio = np.linalg.norm(project(x), axis=1) / np.linalg.norm(x, axis=1)
    assert 0.7 < ratio.min() and ratio.max() < 1.3  # Johnson–Lindenstrauss scaling


def test_full_is_identity_and_bad_names_fail():
    x = np.ones((3, 4), dtype=np.float32)
    assert fit_baseline("full", x, 2)(x) is x
    with pytest.raises(ValueError, match="unknown baseline 'svd'"):
        fit_baseline("svd", x, 2)
    with pytest.raises(ValueError, match="PCA to 5 dims"):
        fit_baseline("pca", x, 5)
