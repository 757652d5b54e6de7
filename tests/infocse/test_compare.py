"""The InfoCSE comparison's per-item test scores and its intervals against the start; the arms'
training itself is covered by tests/train/test_distillation_run.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from distributed_emb.evaluation.document_retrieval import SameDocumentTask, evaluate_same_document
from distributed_emb.evaluation.sts import stsb_score
from distributed_emb.infocse.compare import (
    format_intervals,
    format_report,
    intervals_from_start,
    row_scores,
    scored_test_items,
)
from distributed_emb.infocse.held_out_documents import HeldOut
from distributed_emb.model.embedder import Embedder
from distributed_emb.paths import shipped_senteval_dir

DOCUMENTS = [
    ["A cat sits on the mat.", "The kitten sleeps on a rug.", "Cats like warm places."],
    ["Stocks fell sharply today.", "The market lost two percent.", "Investors sold shares."],
    ["Rain is expected tomorrow.", "A storm moves in from the west."],
]


@pytest.fixture(scope="module")
def small_stsb(tmp_path_factory) -> str:
    """The first 120 STS-B test pairs as a SentEval directory."""
    root = tmp_path_factory.mktemp("senteval")
    target = root / "STS" / "STSBenchmark"
    target.mkdir(parents=True)
    source = Path(shipped_senteval_dir()) / "STS" / "STSBenchmark" / "sts-test.csv"
    lines = source.read_text(encoding="utf-8").splitlines(keepends=True)[:120]
    (target / "sts-test.csv").write_text("".join(lines), encoding="utf-8")
    return str(root)


def _config(senteval_dir: str) -> SimpleNamespace:
    # The fields scored_test_items reads, as InfoCSEConfig holds them.
    return SimpleNamespace(
        training=SimpleNamespace(
            model=SimpleNamespace(pooler="mean", max_seq_length=32),
            eval=SimpleNamespace(batch_size=64, senteval_dir=senteval_dir),
        )
    )


def _heldout() -> HeldOut:
    sentences = [s for document in DOCUMENTS for s in document]
    labels = [i for i, document in enumerate(DOCUMENTS) for _ in document]
    return HeldOut(dev=None, test=SameDocumentTask(sentences, np.array(labels), len(DOCUMENTS)))


def test_the_rows_test_scores_are_the_usual_scores_of_the_per_item_values(
    tiny_bert_path, small_stsb
):
    heldout = _heldout()
    items = scored_test_items(tiny_bert_path, _config(small_stsb), heldout)
    scores = row_scores(items)
    embedder = Embedder(tiny_bert_path, pooler="mean", batch_size=64, max_seq_length=32)
    assert scores["stsb_test"] == pytest.approx(stsb_score(embedder.embed, "test", small_stsb))
    held = evaluate_same_document(embedder.embed, heldout.test)
    for key, metric in [("heldout_mrr", "mrr"), ("heldout_recall_at_1", "recall@1")]:
        assert scores[key] == pytest.approx(held[metric])
    assert len(items["sts"]["STSBenchmark"]["per_pair"]["cosine"]) == 120
    assert len(items["retrieval"]["heldout"]["per_query"]["mrr"]) == len(heldout.test.sentences)
    # The start against itself: no difference, and an interval that holds 0.
    same = intervals_from_start(items, items)
    assert set(same) == {"heldout_recall_at_1", "heldout_mrr", "stsb_test"}
    assert all(v["difference"] == 0.0 and v["low"] <= 0.0 <= v["high"] for v in same.values())


def _items(cosines: np.ndarray, gold: np.ndarray, reciprocal_ranks: list[float]) -> dict:
    return {
        "model": "m",
        "sts": {"STSBenchmark": {"per_pair": {"cosine": list(cosines), "gold": list(gold)}}},
        "retrieval": {
            "heldout": {
                "per_query": {
                    "recall@1": [100.0 * (r == 100.0) for r in reciprocal_ranks],
                    "mrr": reciprocal_ranks,
                }
            }  # fmt: skip
        },
    }


def test_an_arm_against_the_start_in_the_json_and_the_markdown():
    rng = np.random.default_rng(0)
    gold = rng.integers(0, 11, size=100) / 2.0
    start = _items(gold + rng.normal(0, 3.0, 100), gold, [50.0] * 30)
    arm = _items(gold + rng.normal(0, 0.5, 100), gold, [100.0] * 30)
    vs_start = intervals_from_start(start, arm)
    assert vs_start["stsb_test"]["excludes_zero"] and vs_start["stsb_test"]["low"] > 0
    assert vs_start["heldout_mrr"]["difference"] == pytest.approx(50.0)
    rows = [
        {"arm": "start (student)", "stsb_test": 40.0, "steps": None},
        {"arm": "simcse", "stsb_test": 80.0, "steps": 10, "vs_start": vs_start},
        {"arm": "teacher (reference)", "heldout_mrr": 90.0},  # no per-item scores: no row
    ]
    table = format_intervals(rows).splitlines()
    assert table[0] == "| arm − start | held R@1 | held MRR | STS-B test |"
    assert len(table) == 3 and table[2].startswith("| simcse | +100.00 [+100.00, +100.00] *")
    assert "+50.00 [+50.00, +50.00] *" in table[2]
    report = format_report(rows)
    assert report.startswith("| arm |") and "Difference from the start (student)" in report
