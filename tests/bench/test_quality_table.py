"""bench/quality_table.py: rows read from `evaluate.py --baseline` results, intervals kept."""

from __future__ import annotations

from bench.quality_table import markdown, rows


def _difference(baseline: float, candidate: float, low: float, high: float) -> dict:
    return {
        "baseline": baseline,
        "candidate": candidate,
        "difference": candidate - baseline,
        "low": low,
        "high": high,
        "n": 300,
        "n_resamples": 2000,
        "seed": 0,
        "confidence": 0.95,
        "method": "BCa",
    }


def _results(news_test: dict, stsb: dict) -> dict:
    return {
        "comparison": {
            "sts": {"STSBenchmark": stsb},
            "beir": {
                "dev": {"ndcg@10": _difference(95.0, 95.5, -0.2, 1.1)},
                "test": {"ndcg@10": news_test},
            },
        }
    }


def test_each_row_has_its_scores_and_its_interval_against_the_given_model():
    better = _results(_difference(93.0, 94.5, 0.4, 2.6), _difference(82.0, 83.0, 0.5, 1.5))
    level = _results(_difference(93.0, 92.8, -1.0, 0.6), _difference(82.0, 81.9, -0.4, 0.2))
    table = rows({"A": better, "B": level})
    assert table[0] == ["the given model", "82.00", "–", "95.00", "93.00", "", ""]
    assert table[1] == [
        "A",
        "83.00",
        "–",
        "95.50",
        "94.50",
        "+1.50 [+0.40, +2.60] *",
        "+1.00 [+0.50, +1.50] *",
    ]
    assert table[2][5] == "-0.20 [-1.00, +0.60]"  # the interval holds 0: no star
    assert markdown(table).count("\n") == 4
