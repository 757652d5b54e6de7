"""Head training: the returned head is the best STS-B dev epoch, and MCR² raises ΔR."""

from __future__ import annotations

import numpy as np
import pytest

from distributed_emb.losses.mcr2 import MCR2LossConfig
from distributed_emb.mcr2.config import AssignmentConfig, HeadConfig, OptimConfig
from distributed_emb.mcr2.train import HeadTrainingData, head_dev_spearman, train_head


def _toy_data(seed: int = 0) -> HeadTrainingData:
    """Vectors in 5 clusters; dev pairs whose gold score is their true cosine."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((5, 24)) * 2
    ids = rng.integers(0, 5, size=400)
    x = (centres[ids] + rng.standard_normal((400, 24))).astype(np.float32)
    a = rng.standard_normal((120, 24)).astype(np.float32)
    b = (a + rng.standard_normal((120, 24)) * rng.uniform(0.1, 3, (120, 1))).astype(np.float32)
    scores = np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    pairs = (x[:50], x[:50] + 0.05 * rng.standard_normal((50, 24)).astype(np.float32))
    return HeadTrainingData(x, ids, pairs, (a, b, scores))


@pytest.mark.parametrize("source", ["column", "learned"])
def test_returned_head_is_the_best_dev_epoch(source):
    data = _toy_data()
    result = train_head(
        8,
        data,
        HeadConfig(hidden_dims=[32]),
        MCR2LossConfig(eps=0.5, pair_weight=0.5),
        AssignmentConfig(source=source, num_clusters=5),
        OptimConfig(epochs=6, batch_size=128, pair_batch_size=32, lr=3e-3),
    )
    dev_by_epoch = [row["stsb_dev"] for row in result.history]
    assert len(dev_by_epoch) == 7  # the untrained head, then 6 epochs
    assert result.best_epoch == int(np.argmax(dev_by_epoch))
    assert result.best_dev_spearman == pytest.approx(max(dev_by_epoch))
    # The weights handed back are that epoch's, not the last one's.
    assert head_dev_spearman(result.head, data.dev) == pytest.approx(result.best_dev_spearman)
    assert (result.assignment_head is not None) == (source == "learned")


def test_training_increases_the_rate_reduction():
    data = _toy_data(1)
    result = train_head(
        8,
        data,
        HeadConfig(hidden_dims=[32]),
        MCR2LossConfig(eps=0.5, pair_weight=0.0),
        AssignmentConfig(),
        OptimConfig(epochs=8, batch_size=400, lr=3e-3),
    )
    rates = [row["rate_reduction"] for row in result.history[1:]]
    assert rates[-1] > rates[0] + 0.5


def test_hard_assignments_need_cluster_ids():
    data = _toy_data()
    data.cluster_ids = None
    with pytest.raises(ValueError, match="cluster ids are needed"):
        train_head(4, data, HeadConfig(), MCR2LossConfig(), AssignmentConfig(), OptimConfig())
