"""Alignment and uniformity against a direct numpy computation of the definitions."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from distributed_emb.evaluation.geometry import alignment, sts_geometry, uniformity
from distributed_emb.evaluation.senteval_data import StsData


def _unit_rows(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_alignment_matches_definition():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(30, 5)), rng.normal(size=(30, 5))
    xs, ys = _unit_rows(x), _unit_rows(y)
    expected = np.mean([np.sum((a - b) ** 2) for a, b in zip(xs, ys, strict=True)])
    assert alignment(x, y) == pytest.approx(expected)
    assert alignment(x, y, alpha=1) == pytest.approx(np.mean(np.linalg.norm(xs - ys, axis=1)))
    assert alignment(x, 7 * x) == pytest.approx(0.0, abs=1e-12)  # scale-free


@pytest.mark.parametrize("chunk_size", [1, 4, 1024])
def test_uniformity_matches_definition(chunk_size):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(13, 4))
    xs = _unit_rows(x)
    pair_terms = [
        np.exp(-2 * np.sum((xs[i] - xs[j]) ** 2)) for i, j in itertools.combinations(range(13), 2)
    ]
    assert uniformity(x, chunk_size=chunk_size) == pytest.approx(np.log(np.mean(pair_terms)))


def test_uniformity_extremes():
    assert uniformity(np.ones((5, 3))) == pytest.approx(0.0)  # collapsed: worst
    antipodal = np.array([[1.0, 0.0], [-1.0, 0.0]])  # distance² 4 → log exp(−8) = −8
    assert uniformity(antipodal) == pytest.approx(-8.0)


def test_sts_geometry_uses_positive_pairs_and_distinct_sentences():
    vectors = {"a": [1.0, 0.0], "b": [0.0, 1.0], "c": [1.0, 1.0]}
    data = StsData(["a", "a"], ["b", "c"], np.array([4.0, 1.0]), "toy")
    result = sts_geometry(lambda s: np.array([vectors[x] for x in s]), data)
    assert result["n_positive_pairs"] == 1 and result["n_sentences"] == 3
    assert result["alignment"] == pytest.approx(2.0)  # |e1 − e2|² of orthogonal unit vectors
    expected = uniformity(np.array([vectors[x] for x in "abc"]))
    assert result["uniformity"] == pytest.approx(expected)
