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


def _with_documents(output: dict, test_ndcg: np.ndarray, dev_ndcg: float) -> dict:
    """`output` with a held-out documents' yardstick: `test_ndcg` per query on test."""
    per_query = {
        "test": {f"d{i}#0": v for i, v in enumerate(test_ndcg.tolist())},
        "dev": {f"e{i}#0": dev_ndcg for i in range(8)},
    }
    return {
        **output,
        "documents": {
            split: {"metrics": {"ndcg@10": float(np.mean(list(values.values())))},
                    "per_query": {"ndcg@10": values}}
            for split, values in per_query.items()
        },
    }  # fmt: skip


def test_the_held_out_documents_test_split_is_a_column_with_its_interval(comparison):
    """Each row's nDCG@10 on the held-out documents' dev and test splits in the table; on
    test, each row against the encoder and each head against PCA, per query; the job's
    line names a head below the encoder there."""
    from distributed_emb.mcr2.comparison_report import weaker_than_given_lines

    rows, outputs = comparison
    rng = np.random.default_rng(1)
    pca = rng.uniform(20, 80, 40)
    topic = {"full-384": pca + 8, "pca-64": pca, "mcr2-64": pca + 3 + rng.normal(0, 1, 40),
             "mcr2-128": pca + rng.normal(0, 1, 40), "random-128": pca - 2}  # fmt: skip
    outputs = {key: _with_documents(out, topic[key], 30.0) for key, out in outputs.items()}
    dev = {"dev_avg": 80.0, "stsb_dev": 80.0}
    rows = [{**row, **summarise(outputs[f"{row['method']}-{row['dim']}"], dev)} for row in rows]
    head = next(row for row in rows if (row["dim"], row["method"]) == (64, "mcr2"))
    assert head["documents_splits"] == ["test", "dev"] and head["documents_dev_ndcg_at_10"] == 30
    assert head["documents_test_ndcg_at_10"] == pytest.approx(np.mean(topic["mcr2-64"]))
    header = results_table(rows).splitlines()[0]
    assert header.endswith(
        "| news test nDCG@10 | news dev nDCG@10 | held-out documents dev nDCG@10 "
        "| held-out documents test nDCG@10 |"
    )
    intervals = paired_intervals(rows, outputs)
    by_row = {(r["dim"], r["method"]): r["intervals"] for r in intervals["rows"]}
    against_full = by_row[(64, "pca")]["documents_test_ndcg_at_10"]
    assert against_full["difference"] == pytest.approx(-8.0)
    assert against_full["n"] == 40 and against_full["high"] < 0
    assert "documents_dev_ndcg_at_10" not in by_row[(64, "pca")]  # dev chose: no interval
    versus = intervals["versus_pca"][0]["intervals"]["documents_test_ndcg_at_10"]
    assert versus["difference"] == pytest.approx(np.mean(topic["mcr2-64"] - pca))
    assert 2 < versus["low"] <= versus["high"] < 4
    assert (
        intervals_table(intervals).splitlines()[0].endswith("| held-out documents test nDCG@10 |")
    )
    lines = weaker_than_given_lines(intervals)
    assert any(line.startswith("128-d mcr2 head") and "documents_test_ndcg_at_10" in line
               for line in lines)  # fmt: skip
    # A row without the yardstick (heldout.fraction=0) has no such column or interval.
    plain = {key: {k: v for k, v in out.items() if k != "documents"} for key, out in
             outputs.items()}  # fmt: skip
    assert "documents" not in results_table([{**rows[0], **summarise(plain["full-384"], dev)}])
    assert all("documents_test_ndcg_at_10" not in r["intervals"]
               for r in paired_intervals(rows, plain)["rows"])  # fmt: skip


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["eval.select_by=documents:test"], "eval.select_by: documents:test: test splits are "
         "reported, never used to choose; choose on a dev split (documents:dev)"),
        (["eval.select_by=documents:dev", "heldout.fraction=0"],
         "eval.select_by: documents:dev needs held-out documents (heldout.fraction > 0"),
        (["eval.select_by=documents:train"], "eval.select_by: the run's held-out documents/qrels "
         "has no train.tsv"),
    ],
)  # fmt: skip
def test_select_by_documents_names_the_dev_split_of_held_out_documents(overrides, message):
    with pytest.raises(ConfigError) as error:
        load_config(MCR2Config, None, overrides)
    assert str(error.value).startswith(message)


def test_documents_dev_and_auto_are_accepted_and_stsb_dev_stays_the_default():
    def chosen(*overrides: str) -> str:
        return load_config(MCR2Config, None, list(overrides)).eval.select_by

    assert chosen() == "stsb_dev"
    assert chosen("eval.select_by=documents:dev") == "documents:dev"
    # auto: the training job's rule (selection.resolve_auto), resolved before anything runs.
    assert chosen("eval.select_by=auto") == "retrieval:dev"  # shipped:news has a dev split
    assert chosen("eval.select_by=auto", "eval.retrieval_dir=null") == "documents:dev"
    assert (
        chosen("eval.select_by=auto", "eval.retrieval_dir=null", "heldout.fraction=0") == "stsb_dev"
    )
