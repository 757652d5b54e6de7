"""Printing the suite's results as the papers' tables, and writing them as JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from distributed_emb.atomic_files import write_text_atomic
from distributed_emb.evaluation.suite import STS_TASKS, TRANSFER_TASKS

DISPLAY_NAMES = {"STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R", "SST2": "SST"}


def headline(group: str, task: str, result: dict) -> float:
    """The one number a paper's table shows for `task`."""
    if group == "sts":
        return result["all"] if "all" in result else result["spearman"]
    return result["acc"]


def _row_table(group: str, tasks: tuple[str, ...], results: dict) -> list[str]:
    names = [DISPLAY_NAMES.get(t, t) for t in tasks] + ["Avg."]
    values = [headline(group, t, results[t]) if t in results else None for t in tasks]
    present = [v for v in values if v is not None]
    average = float(np.mean(present)) if present else None
    cells = ["-" if v is None else f"{v:.2f}" for v in values]
    cells.append("-" if average is None else f"{average:.2f}")
    width = max(7, *(len(n) + 1 for n in names))
    lines = ["".join(n.rjust(width) for n in names), "".join(c.rjust(width) for c in cells)]
    if present and len(present) < len(tasks):
        lines.append(f"  (Avg. over the {len(present)} of {len(tasks)} tasks present)")
    return lines


BEIR_COLUMNS = {
    "ndcg@10": "nDCG@10",
    "map@100": "MAP@100",
    "recall@1": "R@1",
    "recall@10": "R@10",
    "recall@100": "R@100",
    "mrr@10": "MRR@10",
}


def _beir_table(splits: dict) -> list[str]:
    """One row per split of a BEIR directory: its metrics and its sizes."""
    names = ["split", *BEIR_COLUMNS.values(), "queries", "corpus"]
    rows = [
        [split]
        + [f"{r['metrics'][m]:.2f}" for m in BEIR_COLUMNS]
        + [str(r["n_queries"]), str(r["n_corpus"])]
        for split, r in splits.items()
    ]
    width = max(9, *(len(cell) + 2 for row in [names, *rows] for cell in row))
    return ["".join(cell.rjust(width) for cell in row) for row in [names, *rows]]


def format_results(output: dict) -> str:
    """Tables like SimCSE's: 7 STS (Spearman × 100), 7 transfer (accuracy), then the rest."""
    lines = [f"model: {output['model']} (pooler: {output['pooler'] or 'as saved'})"]
    if output.get("sts"):
        lines += ["", "STS: Spearman x 100 of cosine (STS12-16: all subsets pooled)"]
        lines += _row_table("sts", STS_TASKS, output["sts"])
    if output.get("transfer"):
        lines += ["", "Transfer: accuracy (logistic regression on frozen embeddings)"]
        lines += _row_table("transfer", TRANSFER_TASKS, output["transfer"])
    for task, r in (output.get("retrieval") or {}).items():
        ks = [k for k in r if k.startswith("recall@")]
        lines += [
            "",
            f"Retrieval {task} ({r['n_queries']} queries, corpus {r['n_corpus']}): "
            + "  ".join(f"R@{k.split('@')[1]} {r[k]:.2f}" for k in ks)
            + f"  MRR {r['mrr']:.2f}",
        ]
    if output.get("beir"):
        lines += ["", f"Retrieval, BEIR layout ({output['retrieval_dir']}): x 100, cosine"]
        lines += _beir_table(output["beir"])
    for task, r in (output.get("geometry") or {}).items():
        lines += [
            "",
            f"Geometry {task}: alignment {r['alignment']:.4f}  uniformity {r['uniformity']:.4f}"
            f"  ({r['n_positive_pairs']} positive pairs, {r['n_sentences']} sentences)",
        ]
    if output.get("skipped"):
        lines += ["", "Skipped (data not found):"]
        lines += [f"  {s['task']}: {s['reason']}" for s in output["skipped"]]
    lines += ["", "Wall time:"]
    for group, timing in output["wall_time_s"].items():
        if group == "total_s":
            continue
        encode = f", encode {timing['encode_s']:.1f} s" if "encode_s" in timing else ""
        per_task = ", ".join(
            f"{DISPLAY_NAMES.get(t, t)} {r['wall_s']:.1f} s"
            for t, r in (output.get(group) or {}).items()
            if "wall_s" in r  # BEIR splits share one search: the group's time only
        )
        per_task = f" ({per_task})" if per_task else ""
        lines.append(f"  {group}: {timing['total_s']:.1f} s{encode}{per_task}")
    lines.append(f"  total: {output['wall_time_s']['total_s']:.1f} s")
    return "\n".join(lines)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; a NaN metric becomes null
    return value


def write_results(output: dict, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(_jsonable(output), indent=2) + "\n")
