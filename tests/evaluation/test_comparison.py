"""Two evaluation outputs compared task by task (evaluation/comparison.py), and
jobs/evaluate.py --baseline."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from harness.jobs import run
from scipy.stats import spearmanr

from distributed_emb.errors import UserInputError
from distributed_emb.evaluation.comparison import compare_results, format_comparison


def _outputs() -> tuple[dict, dict]:
    """A baseline and a candidate output as the suite writes them: STS-B with per-pair
    cosines, the built-in retrieval task with per-query lists, a BEIR split with per-query
    {query id: value}; STS12 only in the candidate's."""
    rng = np.random.default_rng(0)
    gold = rng.integers(0, 11, size=120) / 2.0
    noisy, sharp = gold + rng.normal(0, 2.0, 120), gold + rng.normal(0, 0.3, 120)
    qids = [f"q{i}" for i in range(60)]
    ndcg_base = dict(zip(qids, rng.uniform(0, 60, 60), strict=True))
    ndcg_cand = {q: v + 30.0 for q, v in ndcg_base.items()}

    def output(model: str, cosines: np.ndarray, rr: list[float], ndcg: dict) -> dict:
        return {
            "model": model,
            "sts": {
                "STSBenchmark": {
                    "spearman": 100 * spearmanr(cosines, gold).statistic,
                    "per_pair": {"cosine": cosines.tolist(), "gold": gold.tolist()},
                }
            },
            "retrieval": {
                "STSBenchmark-retrieval": {"per_query": {"recall@1": [0.0, 100.0] * 20, "mrr": rr}}
            },
            "beir": {"test": {"per_query": {"recall@10": ndcg, "ndcg@10": ndcg}}},
        }

    baseline = output("base", noisy, [50.0, 100.0] * 20, ndcg_base)
    # The candidate's queries in another order: BEIR's per-query values align by query id.
    candidate = output("cand", sharp, [100.0] * 40, dict(reversed(list(ndcg_cand.items()))))
    candidate["sts"]["STS12"] = baseline["sts"]["STSBenchmark"]
    return baseline, candidate


def test_every_shared_task_gets_its_difference_and_interval():
    baseline, candidate = _outputs()
    comparison = compare_results(baseline, candidate, seed=1)
    stsb = comparison["sts"]["STSBenchmark"]
    assert stsb["baseline"] == pytest.approx(baseline["sts"]["STSBenchmark"]["spearman"])
    assert stsb["candidate"] == pytest.approx(candidate["sts"]["STSBenchmark"]["spearman"])
    assert stsb["excludes_zero"] and stsb["n"] == 120 and stsb["seed"] == 1
    mrr = comparison["retrieval"]["STSBenchmark-retrieval"]["mrr"]
    assert mrr["difference"] == pytest.approx(25.0) and mrr["low"] > 0
    assert list(comparison["retrieval"]["STSBenchmark-retrieval"]) == ["mrr", "recall@1"]
    beir = comparison["beir"]["test"]
    assert list(beir) == ["ndcg@10", "recall@10"]  # nDCG@10 leads
    # Aligned by query id: every query gains exactly 30, so every resample's mean does too.
    assert (beir["ndcg@10"]["difference"], beir["ndcg@10"]["low"]) == (
        pytest.approx(30.0),
        pytest.approx(30.0),
    )
    assert comparison["not_compared"] == [
        {"task": "sts.STS12", "reason": "only the candidate results have it"}
    ]
    text = format_comparison(comparison)
    assert "candidate cand − baseline base" in text
    assert "| STS-B | Spearman |" in text and "| BEIR test | ndcg@10 |" in text
    assert "not compared: sts.STS12" in text


def test_results_without_per_item_values_are_listed_not_compared():
    baseline, candidate = _outputs()
    del baseline["sts"]["STSBenchmark"]["per_pair"]  # a results file from before
    comparison = compare_results(baseline, candidate)
    assert "STSBenchmark" not in comparison["sts"]
    assert {"task": "sts.STSBenchmark", "reason": "no per-pair predictions in the results"} in (
        comparison["not_compared"]
    )


def test_different_items_are_refused_naming_the_task():
    baseline, candidate = _outputs()
    candidate["sts"]["STSBenchmark"]["per_pair"]["gold"][0] += 1.0
    with pytest.raises(UserInputError, match="sts.STSBenchmark: the two results scored diff"):
        compare_results(baseline, candidate)
    baseline, candidate = _outputs()
    candidate["beir"]["test"]["per_query"]["ndcg@10"].pop("q3")
    with pytest.raises(UserInputError, match=r"beir.test.ndcg@10: .*1 only in the baseline"):
        compare_results(baseline, candidate)


def _small_stsb(root: Path) -> Path:
    """A SentEval directory holding the first 150 STS-B test pairs (some scored ≥ 4, so the
    retrieval task has queries)."""
    from distributed_emb.paths import shipped_senteval_dir

    target = root / "STS" / "STSBenchmark"
    target.mkdir(parents=True)
    source = Path(shipped_senteval_dir()) / "STS" / "STSBenchmark" / "sts-test.csv"
    lines = source.read_text(encoding="utf-8").splitlines(keepends=True)[:150]
    (target / "sts-test.csv").write_text("".join(lines), encoding="utf-8")
    return root


def test_evaluate_job_with_a_baseline_prints_and_writes_the_comparison(
    tiny_bert_path, tmp_path, capsys
):
    """The model against itself: every difference is exactly 0, so the two runs' items line
    up (pairs and queries) and the interval holds 0."""
    output = tmp_path / "results.json"
    argv = [tiny_bert_path, "--senteval-data", str(_small_stsb(tmp_path / "senteval")),
            "--tasks", "STSBenchmark,retrieval", "--pooler", "mean", "--max-seq-len", "32",
            "--no-ray", "--baseline", tiny_bert_path, "--output", str(output)]  # fmt: skip
    assert run("evaluate", argv) == 0
    assert "Paired comparison: candidate" in capsys.readouterr().out
    comparison = json.loads(output.read_text())["comparison"]
    stsb = comparison["sts"]["STSBenchmark"]
    assert stsb["n"] == 150 and stsb["difference"] == 0.0 and stsb["low"] <= 0 <= stsb["high"]
    mrr = comparison["retrieval"]["STSBenchmark-retrieval"]["mrr"]
    assert mrr["difference"] == 0.0 and not mrr["excludes_zero"]
    assert comparison["baseline_model"] == tiny_bert_path and comparison["not_compared"] == []


def test_a_baseline_that_is_not_a_model_directory_exits_2(tmp_path, capsys):
    assert run("evaluate", ["--baseline", str(tmp_path / "nope"), "--no-ray"]) == 2
    assert "eval.baseline_model" in capsys.readouterr().err
