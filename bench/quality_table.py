"""The quality table of docs/EVALUATION.md from `jobs/evaluate.py --baseline` results files:
one row per model, each difference against the baseline (the given model) with its paired
95% interval.

    python -m bench.quality_table "InforMin-CL=out/eval_informin.json" \
        "InfoCSE=out/eval_infocse.json" ...

Each results file is one `jobs/evaluate.py CANDIDATE --baseline GIVEN --retrieval DIR
--tasks sts` run; the baseline's own scores come from the first file. Columns: STS-B test and
SICK-R Spearman (where the data held them), nDCG@10 on each retrieval split, and the
difference on the test split and on STS-B test with its interval; a `*` marks an interval
that excludes 0.
"""

from __future__ import annotations

import argparse
import json

from distributed_emb.evaluation.paired_bootstrap import PairedDifference


def _cell(difference: dict | None) -> str:
    if difference is None:
        return "–"
    interval = PairedDifference.from_dict(difference)
    return interval.format() + (" *" if interval.excludes_zero() else "")


def rows(results: dict[str, dict]) -> list[list[str]]:
    """[label, STS-B test, SICK-R, dev nDCG@10, test nDCG@10, Δ test nDCG@10, Δ STS-B test]."""
    first = next(iter(results.values()))["comparison"]
    table = [_row("the given model", first, "baseline")]
    for label, output in results.items():
        table.append(_row(label, output["comparison"], "candidate"))
    return table


def _row(label: str, comparison: dict, side: str) -> list[str]:
    sts, beir = comparison.get("sts", {}), comparison.get("beir", {})

    def score(entry: dict | None) -> str:
        return "–" if entry is None else f"{entry[side]:.2f}"

    def ndcg(split: str) -> dict | None:
        return beir.get(split, {}).get("ndcg@10")

    differences = [_cell(ndcg("test")), _cell(sts.get("STSBenchmark"))]
    if side == "baseline":
        differences = ["", ""]
    return [
        label,
        score(sts.get("STSBenchmark")),
        score(sts.get("SICKRelatedness")),
        score(ndcg("dev")),
        score(ndcg("test")),
        *differences,
    ]


HEADER = [
    "model",
    "STS-B test",
    "SICK-R",
    "news dev nDCG@10",
    "news test nDCG@10",
    "Δ news test [95% CI]",
    "Δ STS-B test [95% CI]",
]


def markdown(table: list[list[str]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|---|" + "---:|" * (len(HEADER) - 1)]
    lines += ["| " + " | ".join(row) + " |" for row in table]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="LABEL=results.json (evaluate.py --baseline)")
    args = parser.parse_args(argv)
    results = {}
    for spec in args.runs:
        label, _, path = spec.rpartition("=")  # a label may hold "="
        with open(path, encoding="utf-8") as handle:
            results[label] = json.load(handle)
    print(markdown(rows(results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
