"""The comparison: output sizes × methods × {dev avg (the heads' selection: STS-B dev and,
where present, SICK-R dev), STS-B dev, STS-B test, SICK-R test, STS12–16, unseen-STS avg,
STS avg, transfer avg, retrieval}, as a table and as a plot; and each row's difference from
the uncompressed encoder on every test set, with its paired-bootstrap 95% interval."""

from __future__ import annotations

import math

import numpy as np

from distributed_emb.evaluation.comparison import compare_results
from distributed_emb.evaluation.paired_bootstrap import PairedDifference
from distributed_emb.evaluation.results_tables import headline
from distributed_emb.plots import Panel
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


def summarise(suite_output: dict, dev_scores: dict[str, float]) -> dict:
    """The table's numbers from one method's evaluation-suite output (see evaluation/suite.py).

    ``sts_avg`` averages the headline Spearman of every STS task present (STS12–16 pooled,
    STS-B test, SICK-R test); ``unseen_sts_avg`` the same without STS-B, the heads' main
    selection domain; ``dev_scores`` are the method's dev Spearmans (``stsb_dev``, maybe
    ``sickr_dev``, and their mean ``dev_avg``: train.dev_scores); ``sts12_16`` the mean
    of the STS12–16 years present (each year's subsets pooled); ``transfer_avg`` the accuracy
    of every transfer task present. Absent groups give None, shown as "-".
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
    }


def _cell(value) -> str:
    return (
        "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}"
    )


def results_table(rows: list[dict]) -> str:
    """rows: {"dim", "method", **summary}; one line per (dim, method), as a Markdown table."""
    header = ["dim", "method", *(title for _, title in COLUMNS)]
    return markdown_table(
        header,
        ([str(row["dim"]), row["method"], *(_cell(row.get(key)) for key, _ in COLUMNS)]
         for row in rows),
    )  # fmt: skip


def paired_intervals(rows: list[dict], suite_outputs: dict[str, dict], seed: int = 0) -> dict:
    """Each row minus the reference row (the uncompressed ``full`` encoder; the first row
    when there is none) on every test set both were scored on: {"reference": "<method>-<dim>",
    "rows": [{"dim", "method", "intervals": {INTERVAL_COLUMNS key: PairedDifference.as_dict()}}]}.
    The items (test pairs, retrieval queries) are resampled and both rows scored on each
    resample (evaluation/comparison.py); `suite_outputs` are the suite's outputs by
    "<method>-<dim>", with their per-item values."""
    if not rows:
        return {"reference": None, "rows": []}
    reference = next((row for row in rows if row["method"] == "full"), rows[0])
    reference_key = f"{reference['method']}-{reference['dim']}"
    out: dict = {"reference": reference_key, "rows": []}
    for row in rows:
        if row is reference:
            continue
        comparison = compare_results(
            suite_outputs[reference_key], suite_outputs[f"{row['method']}-{row['dim']}"], seed
        )
        intervals = {
            _STS_KEYS.get(task, task): result for task, result in comparison["sts"].items()
        }
        first_retrieval = next(iter(comparison["retrieval"].values()), None)
        if first_retrieval is not None:
            intervals["retrieval_mrr"] = first_retrieval["mrr"]
        out["rows"].append({"dim": row["dim"], "method": row["method"], "intervals": intervals})
    return out


def intervals_table(intervals: dict) -> str:
    """:func:`paired_intervals` as a Markdown table, the columns any row has; ``*`` marks an
    interval that excludes 0."""
    present = [
        (key, title)
        for key, title in INTERVAL_COLUMNS
        if any(key in row["intervals"] for row in intervals["rows"])
    ]

    def cell(values: dict | None) -> str:
        if values is None:
            return "-"
        difference = PairedDifference.from_dict(values)
        return difference.format() + (" *" if difference.excludes_zero() else "")

    return markdown_table(
        ["dim", "method", *(title for _, title in present)],
        ([str(row["dim"]), row["method"], *(cell(row["intervals"].get(key)) for key, _ in present)]
         for row in intervals["rows"]),
    )  # fmt: skip


def comparison_panels(rows: list[dict], head_histories: dict[int, list[dict]]) -> list[Panel]:
    """The plot's charts: each column of the table with any number, against the output size,
    one line per method (the uncompressed ``full`` row a dashed reference line); then each
    head's dev average (its selection score) per training epoch."""
    sizes = sorted({row["dim"] for row in rows if row["method"] != "full"})
    methods = list(dict.fromkeys(row["method"] for row in rows if row["method"] != "full"))
    panels = []
    for key, title in COLUMNS:
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
