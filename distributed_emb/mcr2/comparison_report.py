"""The comparison: output sizes × methods × {dev avg (the heads' selection: STS-B dev and,
where present, SICK-R dev), STS-B dev, STS-B test, SICK-R test, STS12–16, unseen-STS avg,
STS avg, transfer avg, retrieval, nDCG@10 of each split of eval.retrieval_dir, nDCG@10 of
the held-out documents' dev and test splits (the document-level yardstick, topic retrieval,
evaluation/document_topics.py)}, as a table and as a plot; and each row's difference from the
uncompressed encoder on every test set (the documents' test split included), and each head's
from PCA at its size, with their paired-bootstrap 95% intervals."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from distributed_emb.evaluation.comparison import compare_results
from distributed_emb.evaluation.paired_bootstrap import PairedDifference
from distributed_emb.evaluation.results_tables import headline
from distributed_emb.paths import SHIPPED_PREFIX
from distributed_emb.plots import Panel
from distributed_emb.selection import TEST_SPLIT, documents_metric, retrieval_metric
from distributed_emb.tables import markdown_table

COLUMNS = (
    ("dev_avg", "dev avg"),
    ("stsb_dev", "STS-B dev"),
    ("stsb_test", "STS-B test"),
    ("sickr_test", "SICK-R test"),
    ("sts12_16", "STS12–16"),
    ("unseen_sts_avg", "unseen STS avg"),
    ("sts_avg", "STS avg"),
    ("transfer_avg", "transfer avg"),
    ("retrieval_mrr", "retrieval MRR"),
)
PLOT_FILE = "heads_vs_baselines.png"
# The test sets an interval is given on, in table order: the table's key for STS-B, SICK-R
# and the first retrieval task's MRR, each STS12–16 year by name.
INTERVAL_COLUMNS = (
    ("stsb_test", "STS-B test"),
    ("sickr_test", "SICK-R test"),
    *((year, year) for year in ("STS12", "STS13", "STS14", "STS15", "STS16")),
    ("retrieval_mrr", "retrieval MRR"),
)
_STS_KEYS = {"STSBenchmark": "stsb_test", "SICKRelatedness": "sickr_test"}
# The suite output's key of the held-out documents' yardstick: {split: evaluation/beir.py
# score_splits result}, written by mcr2/pipeline.py beside the suite's own groups.
DOCUMENTS = "documents"
DOCUMENTS_SPLITS = ("dev", "test")  # the table's columns; the interval: test only
DOCUMENTS_TITLE = "held-out documents"
# The methods compared with PCA at their own size too: what the job trains.
HEAD_METHODS = ("mcr2",)
PCA = "pca"


def retrieval_set_name(directory: str) -> str:
    """A BEIR directory's name for column titles: ``shipped:news`` → news, a path → its last
    part."""
    if directory.startswith(SHIPPED_PREFIX):
        return directory[len(SHIPPED_PREFIX) :]
    return Path(directory).name or directory


def beir_columns(name: str | None, splits: list[str]) -> list[tuple[str, str]]:
    """(key, title) of the nDCG@10 of each split of the run's BEIR set `name`."""
    return [(retrieval_metric(split), f"{name} {split} nDCG@10") for split in splits]


def _beir_set(rows: list[dict]) -> tuple[str | None, list[str]]:
    """The run's BEIR set (one per run) and the splits any row was scored on, in order."""
    name = next((row["retrieval_set"] for row in rows if row.get("retrieval_set")), None)
    return name, list(dict.fromkeys(s for row in rows for s in row.get("beir_splits") or []))


def documents_columns(splits) -> list[tuple[str, str]]:
    """(key, title) of the held-out documents' nDCG@10 on each of `splits`."""
    return [(documents_metric(split), f"{DOCUMENTS_TITLE} {split} nDCG@10") for split in splits]


def table_columns(rows: list[dict]) -> list[tuple[str, str]]:
    """COLUMNS, then each BEIR split's nDCG@10 the rows have, then the held-out documents'."""
    scored = {s for row in rows for s in row.get("documents_splits") or []}
    return [
        *COLUMNS,
        *beir_columns(*_beir_set(rows)),
        *documents_columns(s for s in DOCUMENTS_SPLITS if s in scored),
    ]


def summarise(suite_output: dict, dev_scores: dict[str, float]) -> dict:
    """The table's numbers from one method's evaluation-suite output (see evaluation/suite.py).

    ``sts_avg`` averages the headline Spearman of every STS task present (STS12–16 pooled,
    STS-B test, SICK-R test); ``unseen_sts_avg`` the same without STS-B, the heads' main
    selection domain; ``dev_scores`` are the method's dev Spearmans (``stsb_dev``, maybe
    ``sickr_dev``, and their mean ``dev_avg``: train.dev_scores); ``sts12_16`` the mean
    of the STS12–16 years present (each year's subsets pooled); ``transfer_avg`` the accuracy
    of every transfer task present; ``retrieval_<split>_ndcg_at_10`` the nDCG@10 × 100 of each
    split of eval.retrieval_dir (``beir_splits``, from ``retrieval_set``);
    ``documents_<split>_ndcg_at_10`` that of each split of the held-out documents' yardstick
    (``documents_splits``). Absent groups give None, shown as "-".
    """
    sts = suite_output.get("sts") or {}
    transfer = suite_output.get("transfer") or {}
    retrieval = suite_output.get("retrieval") or {}
    sts_values = [headline("sts", task, result) for task, result in sts.items()]
    transfer_values = [headline("transfer", task, result) for task, result in transfer.items()]
    stsb = sts.get("STSBenchmark")
    unseen = [headline("sts", t, r) for t, r in sts.items() if t != "STSBenchmark"]
    years = [headline("sts", t, r) for t, r in sts.items() if t.startswith("STS1")]
    sick = sts.get("SICKRelatedness")
    first_retrieval = next(iter(retrieval.values()), None)
    beir = suite_output.get("beir") or {}
    documents = suite_output.get(DOCUMENTS) or {}
    return {
        "dev_avg": dev_scores["dev_avg"],
        "stsb_dev": dev_scores["stsb_dev"],
        "sickr_dev": dev_scores.get("sickr_dev"),
        "stsb_test": headline("sts", "STSBenchmark", stsb) if stsb else None,
        "sickr_test": headline("sts", "SICKRelatedness", sick) if sick else None,
        "sts12_16": float(np.mean(years)) if years else None,
        "unseen_sts_avg": float(np.mean(unseen)) if unseen else None,
        "sts_avg": float(np.mean(sts_values)) if sts_values else None,
        "sts_tasks": sorted(sts),
        "transfer_avg": float(np.mean(transfer_values)) if transfer_values else None,
        "transfer_tasks": sorted(transfer),
        "retrieval_mrr": first_retrieval["mrr"] if first_retrieval else None,
        "retrieval_set": retrieval_set_name(suite_output["retrieval_dir"]) if beir else None,
        "beir_splits": list(beir),
        **{retrieval_metric(split): result["metrics"]["ndcg@10"] for split, result in beir.items()},
        "documents_splits": list(documents),
        **{
            documents_metric(split): result["metrics"]["ndcg@10"]
            for split, result in documents.items()
        },
    }


def _cell(value) -> str:
    return (
        "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}"
    )


def results_table(rows: list[dict]) -> str:
    """rows: {"dim", "method", **summary}; one line per (dim, method), as a Markdown table."""
    columns = table_columns(rows)
    header = ["dim", "method", *(title for _, title in columns)]
    return markdown_table(
        header,
        ([str(row["dim"]), row["method"], *(_cell(row.get(key)) for key, _ in columns)]
         for row in rows),
    )  # fmt: skip


def paired_intervals(rows: list[dict], suite_outputs: dict[str, dict], seed: int = 0) -> dict:
    """Each row minus the reference row (the uncompressed ``full`` encoder; the first row
    when there is none), and each head (HEAD_METHODS) minus PCA at its size, on every test set
    both were scored on::

        {"reference": "<method>-<dim>", "rows": [{"dim", "method", "intervals"}],
         "versus_pca": [{"dim", "method", "reference": "pca-<dim>", "intervals"}],
         "retrieval_set": name or None, "beir_splits": [split, ...]}

    with "intervals" {INTERVAL_COLUMNS key, retrieval_<split>_ndcg_at_10 or
    documents_test_ndcg_at_10: PairedDifference.as_dict()}. The items (test pairs, retrieval
    queries) are resampled and both rows scored on each resample (evaluation/comparison.py);
    `suite_outputs` are the suite's outputs by "<method>-<dim>", with their per-item values."""
    name, splits = _beir_set(rows)
    out: dict = {
        "reference": None,
        "rows": [],
        "versus_pca": [],
        "retrieval_set": name,
        "beir_splits": splits,
    }
    if not rows:
        return out
    reference = next((row for row in rows if row["method"] == "full"), rows[0])
    out["reference"] = _key(reference)
    pca = {row["dim"]: row for row in rows if row["method"] == PCA}
    for row in rows:
        if row is not reference:
            intervals = _intervals(suite_outputs, reference, row, seed)
            out["rows"].append({"dim": row["dim"], "method": row["method"], "intervals": intervals})
        if row["method"] in HEAD_METHODS and row["dim"] in pca:
            out["versus_pca"].append(
                {
                    "dim": row["dim"],
                    "method": row["method"],
                    "reference": _key(pca[row["dim"]]),
                    "intervals": _intervals(suite_outputs, pca[row["dim"]], row, seed),
                }
            )
    return out


def _key(row: dict) -> str:
    return f"{row['method']}-{row['dim']}"


def _intervals(suite_outputs: dict[str, dict], baseline: dict, candidate: dict, seed: int) -> dict:
    """candidate − baseline on each test set both rows' outputs hold, by table key."""
    comparison = compare_results(
        suite_outputs[_key(baseline)], suite_outputs[_key(candidate)], seed
    )
    intervals = {_STS_KEYS.get(task, task): result for task, result in comparison["sts"].items()}
    first_retrieval = next(iter(comparison["retrieval"].values()), None)
    if first_retrieval is not None:
        intervals["retrieval_mrr"] = first_retrieval["mrr"]
    for split, metrics in comparison["beir"].items():
        intervals[retrieval_metric(split)] = metrics["ndcg@10"]
    # The held-out documents' test split, per query, by the same comparison (its dev split
    # chose epochs: reported in the table, never given an interval).
    pair = [suite_outputs[_key(row)].get(DOCUMENTS) or {} for row in (baseline, candidate)]
    if all(TEST_SPLIT in documents for documents in pair):
        tests = [{"beir": {TEST_SPLIT: documents[TEST_SPLIT]}} for documents in pair]
        compared = compare_results(*tests, seed)["beir"]
        if TEST_SPLIT in compared:
            intervals[documents_metric(TEST_SPLIT)] = compared[TEST_SPLIT]["ndcg@10"]
    return intervals


def intervals_table(intervals: dict, section: str = "rows") -> str:
    """A part of :func:`paired_intervals` (``rows``: against the reference; ``versus_pca``)
    as a Markdown table, the columns any row has; ``*`` marks an interval that excludes 0."""
    rows = intervals.get(section) or []
    beir = beir_columns(intervals.get("retrieval_set"), intervals.get("beir_splits") or [])
    present = [
        (key, title)
        for key, title in (*INTERVAL_COLUMNS, *beir, *documents_columns([TEST_SPLIT]))
        if any(key in row["intervals"] for row in rows)
    ]

    def cell(values: dict | None) -> str:
        if values is None:
            return "-"
        difference = PairedDifference.from_dict(values)
        return difference.format() + (" *" if difference.excludes_zero() else "")

    return markdown_table(
        ["dim", "method", *(title for _, title in present)],
        ([str(row["dim"]), row["method"], *(cell(row["intervals"].get(key)) for key, _ in present)]
         for row in rows),
    )  # fmt: skip


def comparison_panels(rows: list[dict], head_histories: dict[int, list[dict]]) -> list[Panel]:
    """The plot's charts: each column of the table with any number, against the output size,
    one line per method (the uncompressed ``full`` row a dashed reference line); then each
    head's dev average (its selection score) per training epoch."""
    sizes = sorted({row["dim"] for row in rows if row["method"] != "full"})
    methods = list(dict.fromkeys(row["method"] for row in rows if row["method"] != "full"))
    panels = []
    for key, title in table_columns(rows):
        if not any(_is_value(row.get(key)) for row in rows):
            continue
        series = {
            method: [
                (row["dim"], row[key])
                for row in rows
                if row["method"] == method and _is_value(row.get(key))
            ]
            for method in methods
        }
        references = {
            f"full ({row['dim']})": row[key]
            for row in rows
            if row["method"] == "full" and _is_value(row.get(key))
        }
        scale = "log" if sizes and sizes[-1] >= 4 * sizes[0] else "linear"
        panels.append(Panel(title, "output size", series, references, sizes, scale))
    panels.append(
        Panel(
            "MCR² head training: dev avg",
            "epoch",
            {
                f"head {dim}": [(r["epoch"], r["dev_avg"]) for r in history]
                for dim, history in head_histories.items()
            },
        )
    )
    return panels


def _is_value(value) -> bool:
    return isinstance(value, (int, float)) and not math.isnan(value)


def weaker_than_given_lines(intervals: dict) -> list[str]:
    """One line per exported head (HEAD_METHODS) that is measurably below the uncompressed
    model on a test set, naming each such set with its difference and interval: a compressed
    export is a smaller vector, and the job says when it is also a weaker one."""
    if intervals.get("reference") is None or not intervals["reference"].startswith("full-"):
        return []
    lines = []
    for row in intervals.get("rows", []):
        if row["method"] not in HEAD_METHODS:
            continue
        below = [
            f"{key} {PairedDifference.from_dict(value).format()}"
            for key, value in row["intervals"].items()
            if value["high"] < 0
        ]
        if below:
            lines.append(
                f"{row['dim']}-d {row['method']} head: below the given model beyond the "
                f"interval on {', '.join(below)} (a smaller vector; docs/MCR2.md)"
            )
    return lines
