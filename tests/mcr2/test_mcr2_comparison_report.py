"""The comparison's retrieval columns and intervals, on made-up suite outputs: each BEIR
split's nDCG@10 in the table, each row against the encoder and each head against PCA at its
size, per query."""

from __future__ import annotations

import numpy as np
import pytest

from distributed_emb.checks import ConfigError
from distributed_emb.config import load_config
from distributed_emb.evaluation.paired_bootstrap import PairedDifference
from distributed_emb.mcr2.comparison_report import (
    intervals_table,
    paired_intervals,
    results_table,
    summarise,
)
from distributed_emb.mcr2.compression_config import MCR2Config

QUERIES = [f"q{i}" for i in range(60)]


def _beir_output(test_ndcg: np.ndarray, dev_ndcg: float = 50.0) -> dict:
    """A suite output holding only a BEIR set: `test_ndcg` per query on test, a constant dev."""
    per_query = {
        "test": dict(zip(QUERIES, test_ndcg.tolist())),
        "dev": dict.fromkeys(QUERIES[:10], dev_ndcg),
    }
    return {
        "retrieval_dir": "shipped:news",
        "beir": {
            split: {"metrics": {"ndcg@10": float(np.mean(list(values.values())))},
                    "per_query": {"ndcg@10": values}}
            for split, values in per_query.items()
        },
    }  # fmt: skip


@pytest.fixture(scope="module")
def comparison() -> tuple[list[dict], dict]:
    """full (384), pca and mcr2 at 64, mcr2 and random at 128 (no PCA there). Per query, the
    64-d head is PCA + 5 and the encoder PCA + 10, with noise."""
    rng = np.random.default_rng(0)
    pca = rng.uniform(20, 80, len(QUERIES))
    scores = {
        "full-384": pca + 10 + rng.normal(0, 1, len(QUERIES)),
        "pca-64": pca,
        "mcr2-64": pca + 5 + rng.normal(0, 1, len(QUERIES)),
        "mcr2-128": pca + rng.normal(0, 1, len(QUERIES)),
        "random-128": pca - 3 + rng.normal(0, 1, len(QUERIES)),
    }
    outputs = {key: _beir_output(values) for key, values in scores.items()}
    dev = {"dev_avg": 80.0, "stsb_dev": 80.0}
    rows = []
    for key, output in outputs.items():
        method, dim = key.split("-")
        rows.append({"dim": int(dim), "method": method, **summarise(output, dev)})
    return rows, outputs


def test_each_split_is_a_column_of_the_table(comparison):
    rows, outputs = comparison
    head = next(row for row in rows if (row["dim"], row["method"]) == (64, "mcr2"))
    assert head["retrieval_set"] == "news" and head["beir_splits"] == ["test", "dev"]
    assert (
        head["retrieval_test_ndcg_at_10"]
        == outputs["mcr2-64"]["beir"]["test"]["metrics"]["ndcg@10"]
    )
    assert head["retrieval_dev_ndcg_at_10"] == 50.0
    header = results_table(rows).splitlines()[0]
    assert header.endswith("| news test nDCG@10 | news dev nDCG@10 |")
    # A run without a retrieval directory has no such column.
    plain = summarise({}, {"dev_avg": 1.0, "stsb_dev": 1.0})
    assert plain["beir_splits"] == [] and "nDCG@10" not in results_table(
        [plain | {"dim": 8, "method": "pca"}]
    )


def test_every_row_against_the_encoder_per_query(comparison):
    rows, outputs = comparison
    intervals = paired_intervals(rows, outputs)
    assert intervals["reference"] == "full-384"
    assert [(r["dim"], r["method"]) for r in intervals["rows"]] == [
        (64, "pca"), (64, "mcr2"), (128, "mcr2"), (128, "random"),
    ]  # fmt: skip
    pca = intervals["rows"][0]["intervals"]["retrieval_test_ndcg_at_10"]
    full, pca_scores = (np.array(list(outputs[k]["beir"]["test"]["per_query"]["ndcg@10"].values()))
                        for k in ("full-384", "pca-64"))  # fmt: skip
    assert pca["difference"] == pytest.approx(np.mean(pca_scores - full))
    assert pca["n"] == len(QUERIES) and pca["high"] < 0 and pca["excludes_zero"]


def test_each_head_against_pca_at_its_size(comparison):
    rows, outputs = comparison
    versus = paired_intervals(rows, outputs)["versus_pca"]
    # Only heads, and only where a PCA row of the same size exists (none at 128).
    assert [(r["dim"], r["method"], r["reference"]) for r in versus] == [(64, "mcr2", "pca-64")]
    test = versus[0]["intervals"]["retrieval_test_ndcg_at_10"]
    assert test["baseline"] == pytest.approx(np.mean(list(
        outputs["pca-64"]["beir"]["test"]["per_query"]["ndcg@10"].values())))  # fmt: skip
    assert 4 < test["low"] <= test["difference"] <= test["high"] < 6
    # Equal per-query dev scores: a difference of 0 exactly, an interval that does not exclude 0.
    dev = versus[0]["intervals"]["retrieval_dev_ndcg_at_10"]
    assert dev["difference"] == 0 and not dev["excludes_zero"]
    table = intervals_table(paired_intervals(rows, outputs), "versus_pca")
    assert table.splitlines()[0] == "| dim | method | news test nDCG@10 | news dev nDCG@10 |"
    cell = PairedDifference.from_dict(test).format()
    assert table.splitlines()[2] == f"| 64 | mcr2 | {cell} * | +0.00 [+0.00, +0.00] |"


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["eval.retrieval_splits=[train]"], "eval.retrieval_splits[0]: shipped:news/qrels has "
         "no train.tsv; its splits: dev, test"),
        (["eval.retrieval_dir=shipped:sports"], "eval.retrieval_dir: shipped:sports: no shipped"),
        (["eval.retrieval_dir=null", "eval.retrieval_splits=[dev]"],
         "eval.retrieval_splits: given without eval.retrieval_dir"),
        (["eval.retrieval_splits=[]"], "eval.retrieval_splits: is empty"),
        (["loss.expand_weight=0", "loss.compress_weight=0", "loss.pair_weight=0",
          "loss.distill_weight=0"], "loss: every term is off"),
    ],
)  # fmt: skip
def test_bad_retrieval_and_loss_settings_are_refused_by_key(overrides, message):
    with pytest.raises(ConfigError) as error:
        load_config(MCR2Config, None, overrides)
    assert str(error.value).startswith(message)


def test_the_default_run_scores_the_shipped_news_set_and_distillation_alone_is_a_setting():
    config = load_config(MCR2Config, None, [])
    assert config.eval.retrieval_dir == "shipped:news" and config.eval.retrieval_splits is None
    off = ["loss.expand_weight=0", "loss.compress_weight=0", "loss.pair_weight=0"]
    distill_only = load_config(MCR2Config, None, [*off, "loss.distill_weight=10"]).loss
    assert (distill_only.expand_weight, distill_only.distill_weight) == (0, 10)


def test_a_head_measurably_below_the_given_model_is_named_in_one_line():
    from distributed_emb.mcr2.comparison_report import weaker_than_given_lines

    def interval(low, high):
        return {
            "baseline": 90.0,
            "candidate": 89.0,
            "difference": (low + high) / 2,
            "low": low,
            "high": high,
            "n": 100,
            "n_resamples": 2000,
            "seed": 0,
            "confidence": 0.95,
        }

    intervals = {
        "reference": "full-384",
        "rows": [
            {
                "dim": 64,
                "method": "mcr2",
                "intervals": {
                    "stsb_test": interval(-3.0, -1.0),
                    "retrieval_test_ndcg_at_10": interval(-1.0, 0.5),
                },
            },
            {"dim": 128, "method": "mcr2", "intervals": {"stsb_test": interval(-0.5, 0.4)}},
            {"dim": 64, "method": "pca", "intervals": {"stsb_test": interval(-4.0, -2.0)}},
        ],
    }
    lines = weaker_than_given_lines(intervals)
    assert len(lines) == 1  # the 128-d head's interval holds 0; PCA is not an exported head
    assert lines[0].startswith("64-d mcr2 head: below the given model") and "stsb_test" in lines[0]
    assert "retrieval_test" not in lines[0]
    assert weaker_than_given_lines({**intervals, "reference": "pca-64"}) == []
