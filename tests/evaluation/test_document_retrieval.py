"""Held-out-document retrieval: the split, the task and the ranks against a brute-force loop."""

from __future__ import annotations

import numpy as np
import pytest

from distributed_emb.data.held_out import held_out_doc_ids
from distributed_emb.evaluation.document_retrieval import (
    SameDocumentTask,
    evaluate_same_document,
    same_document_ranks,
)


def brute_force_ranks(embeddings: np.ndarray, doc_index: np.ndarray) -> list[int]:
    """Sort every other sentence by cosine, placing ties *before* relevant ones (pessimistic),
    and return the 1-based position of the first sentence of the query's document."""
    x = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    ranks = []
    for i in range(len(x)):
        candidates = [j for j in range(len(x)) if j != i]
        relevant = {j for j in candidates if doc_index[j] == doc_index[i]}
        ordered = sorted(candidates, key=lambda j: (-float(x[i] @ x[j]), j in relevant))
        ranks.append(next(p for p, j in enumerate(ordered, 1) if j in relevant))
    return ranks


def test_ranks_equal_a_brute_force_sort_on_random_data():
    rng = np.random.default_rng(0)
    doc_index = np.repeat(np.arange(7), [2, 3, 4, 2, 5, 3, 2])  # (21,)
    centres = rng.normal(size=(7, 6))
    embeddings = centres[doc_index] + 1.5 * rng.normal(size=(21, 6))
    ranks = same_document_ranks(embeddings, doc_index, chunk_size=5)  # several chunks
    assert ranks.tolist() == brute_force_ranks(embeddings, doc_index)
    assert ranks.min() >= 1 and ranks.max() > 1  # the data is not trivially separable


def test_hand_made_ranks_and_metrics_with_ties():
    # Document 0: sentences at 0° and 90°; document 1: at 10° and 80°.
    angles = np.deg2rad([0, 90, 10, 80])
    embeddings = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    doc_index = np.array([0, 0, 1, 1])
    # 0° sees 10° (other doc), 80° (other), then 90°: rank 3. 10° sees 0°(other) and 80°
    # (same, 70° away) — 0° is 10° away: rank 2. Symmetric for the others.
    assert same_document_ranks(embeddings, doc_index).tolist() == [3, 3, 2, 2]
    # A collapsed encoder: every similarity ties, so every other-document sentence counts.
    collapsed = np.ones((4, 3))
    assert same_document_ranks(collapsed, doc_index).tolist() == [3, 3, 3, 3]
    task = SameDocumentTask(["a", "b", "c", "d"], doc_index, 2)
    table = {"a": embeddings[0], "b": embeddings[1], "c": embeddings[2], "d": embeddings[3]}
    result = evaluate_same_document(lambda s: np.stack([table[t] for t in s]), task, ks=(1, 2))
    assert result["recall@1"] == 0.0
    assert result["recall@2"] == 50.0
    assert result["mrr"] == pytest.approx(100 * (1 / 3 + 1 / 3 + 1 / 2 + 1 / 2) / 4)
    assert (result["n_queries"], result["n_documents"]) == (4, 2)


def test_split_is_by_document_deterministic_and_order_free():
    ids = [f"doc-{i}" for i in range(2000)]
    held = held_out_doc_ids(ids, 0.1, seed=3)
    assert held == held_out_doc_ids(list(reversed(ids)), 0.1, seed=3)
    assert held_out_doc_ids(ids[:500], 0.1, seed=3) == {d for d in held if d in set(ids[:500])}
    assert 150 < len(held) < 250  # about a tenth
    assert held != held_out_doc_ids(ids, 0.1, seed=4)
    assert held_out_doc_ids(ids, 0.0) == set()
    with pytest.raises(ValueError, match="fraction"):
        held_out_doc_ids(ids, 1.0)


def test_task_from_documents_caps_sorts_and_drops_single_sentence_documents():
    documents = [
        {"doc_id": "b", "sentences": ["b1", "b2", "b3", "b4"]},
        {"doc_id": "a", "sentences": ["a1", " ", "a1", "a2"]},  # blank and repeat dropped
        {"doc_id": "c", "sentences": ["c1"]},  # no relevant candidate: left out
        {"doc_id": "d", "sentences": ["b1", "d1"]},  # b1 already b's: d keeps one → left out
    ]
    task = SameDocumentTask.from_documents(documents, max_sentences_per_document=3)
    assert task.sentences == ["a1", "a2", "b1", "b2", "b3"]
    assert task.doc_index.tolist() == [0, 0, 1, 1, 1]
    assert task.num_documents == 2
    with pytest.raises(ValueError, match="at least 2"):
        SameDocumentTask(["x", "y"], np.array([0, 1]), 2)
