"""Two models' evaluation results side by side: each difference with its paired 95% interval.

`compare_results` takes two outputs of the evaluation suite (``evaluate``, or their results
JSON read back) of the *same* tasks and data, and for every task both hold:

- each STS task (STS-B, SICK-R, STS12–16 with its subsets pooled, as the table's headline):
  Spearman × 100, the sentence pairs resampled (``per_pair``: cosine and gold);
- each retrieval task (STS-B retrieval) and each BEIR split: every per-query metric's mean
  (nDCG@10 first for BEIR), the queries resampled (``per_query``).

The intervals are :mod:`~distributed_emb.evaluation.paired_bootstrap`'s (paired, BCa): the
same items scored by both models, so only the difference's uncertainty is measured. Tasks only
one output holds, or results written without per-item values, are listed under
``not_compared`` with the reason, never silently left out.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import numpy as np

from distributed_emb.errors import UserInputError
from distributed_emb.evaluation.paired_bootstrap import (
    PairedDifference,
    paired_mean_difference,
    paired_spearman_difference,
)
from distributed_emb.tables import markdown_table

N_RESAMPLES = 2000
CONFIDENCE = 0.95
STS_NAMES = {"STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R"}
# The metric each retrieval result leads with, then the others in the result's own order.
LEAD_METRIC = {"retrieval": "mrr", "beir": "ndcg@10"}


def compare_results(baseline_output: dict, candidate_output: dict, seed: int = 0) -> dict:
    """candidate − baseline on every STS task and retrieval split both outputs hold.

    Returns {"baseline_model", "candidate_model", "seed", "n_resamples", "confidence",
    "sts": {task: PairedDifference.as_dict()}, "retrieval": {task: {metric: ...}},
    "beir": {split: {metric: ...}}, "not_compared": [{"task", "reason"}]}. Raises
    UserInputError naming the task when the two outputs scored different items."""
    comparison: dict = {
        "baseline_model": baseline_output.get("model"),
        "candidate_model": candidate_output.get("model"),
        "seed": seed,
        "n_resamples": N_RESAMPLES,
        "confidence": CONFIDENCE,
        "sts": {},
        "retrieval": {},
        "beir": {},
        "not_compared": [],
    }
    options = {"seed": seed, "n_resamples": N_RESAMPLES, "confidence": CONFIDENCE}
    for task, (baseline, candidate) in _shared(
        baseline_output, candidate_output, "sts", comparison
    ):
        where = f"sts.{task}"
        if "per_pair" not in baseline or "per_pair" not in candidate:
            comparison["not_compared"].append(
                {"task": where, "reason": "no per-pair predictions in the results"}
            )
            continue
        with _named(where):
            gold = _same_items(where, baseline["per_pair"]["gold"], candidate["per_pair"]["gold"])
            difference = paired_spearman_difference(
                gold, baseline["per_pair"]["cosine"], candidate["per_pair"]["cosine"], **options
            )
        comparison["sts"][task] = difference.as_dict()
    for group in ("retrieval", "beir"):
        for task, (baseline, candidate) in _shared(
            baseline_output, candidate_output, group, comparison
        ):
            if "per_query" not in baseline or "per_query" not in candidate:
                comparison["not_compared"].append(
                    {"task": f"{group}.{task}", "reason": "no per-query values in the results"}
                )
                continue
            comparison[group][task] = {}
            for metric in _metric_order(baseline["per_query"], LEAD_METRIC[group]):
                where = f"{group}.{task}.{metric}"
                with _named(where):
                    difference = paired_mean_difference(
                        *_aligned(
                            where, baseline["per_query"][metric], candidate["per_query"].get(metric)
                        ),
                        **options,
                    )
                comparison[group][task][metric] = difference.as_dict()
    return comparison


def _shared(baseline_output: dict, candidate_output: dict, group: str, comparison: dict):
    """(task, (baseline result, candidate result)) of every task of `group` both outputs
    hold, in the baseline's order; a task only one holds goes to ``not_compared``."""
    baseline_tasks = baseline_output.get(group) or {}
    candidate_tasks = candidate_output.get(group) or {}
    for task in sorted(baseline_tasks.keys() ^ candidate_tasks.keys()):
        side = "baseline" if task in baseline_tasks else "candidate"
        comparison["not_compared"].append(
            {"task": f"{group}.{task}", "reason": f"only the {side} results have it"}
        )
    for task, baseline in baseline_tasks.items():
        if task in candidate_tasks:
            yield task, (baseline, candidate_tasks[task])


def _metric_order(per_query: Mapping, lead: str) -> list[str]:
    return sorted(per_query, key=lambda metric: metric != lead)  # stable: the rest keep order


def _same_items(where: str, baseline: Sequence, candidate: Sequence) -> np.ndarray:
    """The gold scores both results hold, which must be the same pairs'."""
    baseline_, candidate_ = np.asarray(baseline, float), np.asarray(candidate, float)
    if baseline_.shape != candidate_.shape or not np.array_equal(baseline_, candidate_):
        raise UserInputError(
            f"{where}: the two results scored different pairs (gold scores differ: "
            f"{len(baseline_)} and {len(candidate_)} items); compare results of the same data"
        )
    return baseline_


def _aligned(
    where: str, baseline: Sequence | Mapping | None, candidate: Sequence | Mapping | None
) -> tuple[np.ndarray, np.ndarray]:
    """The two per-query arrays in one query order: BEIR's {query id: value} by the baseline's
    ids, the built-in task's lists as they are (both in the task's query order)."""
    if candidate is None:
        raise UserInputError(f"{where}: only the baseline results have this metric")
    if isinstance(baseline, Mapping) and isinstance(candidate, Mapping):
        if baseline.keys() != candidate.keys():
            missing = len(baseline.keys() - candidate.keys())
            extra = len(candidate.keys() - baseline.keys())
            raise UserInputError(
                f"{where}: the two results scored different queries ({missing} only in the "
                f"baseline, {extra} only in the candidate); compare results of the same split"
            )
        ids = list(baseline)
        return np.array([baseline[q] for q in ids]), np.array([candidate[q] for q in ids])
    if len(baseline) != len(candidate):
        raise UserInputError(
            f"{where}: the two results scored different queries ({len(baseline)} and "
            f"{len(candidate)}); compare results of the same data"
        )
    return np.asarray(baseline, float), np.asarray(candidate, float)


@contextmanager
def _named(where: str) -> Iterator[None]:
    """A ValueError of the bootstrap (too few items, constant scores) as a UserInputError
    that names the task."""
    try:
        yield
    except UserInputError:
        raise
    except ValueError as error:
        raise UserInputError(f"{where}: {error}") from None


def format_comparison(comparison: dict) -> str:
    """The comparison as a Markdown table: one row per STS task and retrieval metric, the
    baseline's and the candidate's score and the difference with its interval; ``*`` marks an
    interval that excludes 0."""
    rows = []
    for task, result in comparison["sts"].items():
        rows.append(_row(STS_NAMES.get(task, task), "Spearman", result))
    for group in ("retrieval", "beir"):
        for task, metrics in comparison[group].items():
            name = f"BEIR {task}" if group == "beir" else task
            rows += [_row(name, metric, result) for metric, result in metrics.items()]
    confidence = round(100 * comparison["confidence"])
    lines = [
        f"Paired comparison: candidate {comparison['candidate_model']} − baseline "
        f"{comparison['baseline_model']} ({confidence}% paired-bootstrap intervals, "
        f"{comparison['n_resamples']} resamples of the items, seed {comparison['seed']}; "
        "* the interval excludes 0)",
        "",
    ]
    if rows:
        lines.append(
            markdown_table(
                ["task", "metric", "baseline", "candidate", "difference [interval]", ""],
                rows,
                right_aligned="--rrr-",
            )
        )
    else:
        lines.append("(no task both results hold)")
    lines += [f"not compared: {n['task']}: {n['reason']}" for n in comparison["not_compared"]]
    return "\n".join(lines)


def _row(task: str, metric: str, result: dict) -> list[str]:
    method = "" if result["method"] == "BCa" else f" ({result['method']})"
    return [
        task,
        metric,
        f"{result['baseline']:.2f}",
        f"{result['candidate']:.2f}",
        PairedDifference.from_dict(result).format() + method,
        "*" if result["excludes_zero"] else "",
    ]
