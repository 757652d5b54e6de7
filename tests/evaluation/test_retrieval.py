"""Retrieval metrics on a hand-made example with known ranks."""

from __future__ import annotations

import numpy as np
import pytest

from distributed_emb.evaluation.retrieval import (
    RetrievalTask,
    evaluate_retrieval,
    metrics_from_ranks,
    positive_ranks,
    sts_retrieval_task,
)
from distributed_emb.evaluation.senteval_data import StsData


def _unit(angle_degrees: float) -> list[float]:
    a = np.deg2rad(angle_degrees)
    return [np.cos(a), np.sin(a)]


def test_ranks_on_a_hand_made_circle():
    # Corpus at 0°, 10°, 20°, ..., 90°; query at 0°. Cosine falls with the angle, so the
    # entry at k·10° ranks k+1-th. Positives chosen to rank 1, 3 and 10.
    corpus = np.array([_unit(10 * k) for k in range(10)]) * np.arange(1, 11)[:, None]
    queries = np.array([_unit(0), _unit(0), _unit(0)]) * 3.0  # norms must not matter
    ranks = positive_ranks(queries, corpus, np.array([0, 2, 9]))
    assert ranks.tolist() == [1, 3, 10]
    metrics = metrics_from_ranks(ranks, ks=(1, 5, 10))
    assert metrics["recall@1"] == pytest.approx(100 / 3)
    assert metrics["recall@5"] == pytest.approx(200 / 3)
    assert metrics["recall@10"] == pytest.approx(100.0)
    assert metrics["mrr"] == pytest.approx(100 * (1 + 1 / 3 + 1 / 10) / 3)


def test_ties_count_against_the_query():
    collapsed = np.ones((4, 3))  # every sentence embedded identically
    assert positive_ranks(collapsed[:2], collapsed, np.array([0, 3])).tolist() == [4, 4]


def test_evaluate_retrieval_dedupes_corpus_and_maps_positives():
    # A lookup "encoder": sentence text -> fixed vector.
    vectors = {"q1": _unit(0), "q2": _unit(90), "p1": _unit(5), "p2": _unit(60), "d": _unit(80)}
    task = RetrievalTask(["q1", "q2"], ["p1", "p2"], "toy", distractors=["d", "p1"])
    corpus, positive_index = task.corpus()
    assert corpus == ["p1", "p2", "d"] and positive_index.tolist() == [0, 1]
    result = evaluate_retrieval(lambda s: np.array([vectors[x] for x in s]), task, ks=(1, 2))
    # q1: p1 first. q2 (90°): d at 80° beats p2 at 60°, so p2 ranks 2.
    assert result["recall@1"] == pytest.approx(50.0)
    assert result["recall@2"] == pytest.approx(100.0)
    assert result["mrr"] == pytest.approx(75.0)
    assert result["n_corpus"] == 3


def test_sts_retrieval_task_threshold_and_distractors():
    data = StsData(
        ["a", "b", "c", "d"], ["A", "B", "C", "a"], np.array([4.0, 4.5, 1.0, 2.0]), "sts"
    )
    task = sts_retrieval_task(data, threshold=4.0)
    assert task.queries == ["a", "b"] and task.positives == ["A", "B"]
    # "C" is a distractor; "a" is excluded because it is a query text already.
    assert task.distractors == ["C"]
