"""After the search: everything a user takes away, written into the output directory.

- results.csv, results.md: the table, best selection score (eval.select_by) first, errored
  trials included;
- best_config.yaml: the best trial's full TrainingConfig (jobs/train_informin.py --config);
- best_model/: its best checkpoint, exported (SentenceTransformer(path) loads it);
- plots/*.png: metric vs each searched key, learning curves;
- summary.json: the facts (best trial and score, STS-B test, resources, times).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict

from distributed_emb.atomic_files import write_text_atomic
from distributed_emb.selection import describe
from distributed_emb.train.driver import stsb_test
from distributed_emb.tune.driver import SearchRun, search_paths
from distributed_emb.tune.results import (
    ERROR,
    best_training_config,
    best_trial,
    export_best_model,
    summarize_trials,
    table_rows,
    trials_markdown,
    write_best_config,
    write_table,
)
from distributed_emb.tune.search_config import SearchJobConfig
from distributed_emb.tune.search_plots import plot_learning_curves, plot_metric_vs_params

log = logging.getLogger(__name__)


def write_search_report(config: SearchJobConfig, run: SearchRun) -> dict:
    paths = search_paths(config)
    output = paths.output
    space = config.space()
    trials = summarize_trials(run.experiment_path, paths.train_storage, paths.name)
    select_by = config.eval.select_by
    rows = table_rows(trials, list(space), select_by)
    csv_path, md_path = write_table(rows, output)
    summary = {
        **asdict(run),
        "space": {key: distribution.describe() for key, distribution in space.items()},
        "trials": len(trials),
        "errored": [t.trial_id for t in trials if t.status == ERROR],
        "table": str(md_path),
        "table_csv": str(csv_path),
        "best_trial": None,
        "select_by": select_by,  # what chose the best trial and its checkpoint
    }
    best = best_trial(trials)
    if best is not None and not run.interrupted:
        best_config = best_training_config(config.base(), best, output)
        summary |= {
            "best_trial": best.trial_id,
            "best_params": best.params,
            "best_score": best.best_score,  # the select_by score
            "best_step": best.best[0],
            "best_checkpoint": best.best_checkpoint,
            "best_config": str(write_best_config(best_config, best, output / "best_config.yaml")),
        }
        if config.tune.export_best:
            model_dir = export_best_model(best_config, best, output / "best_model")
            summary["best_model"] = model_dir
            if config.eval.test_after_training:
                summary["best_stsb_test"] = stsb_test(best_config, model_dir)
    if config.tune.plots:
        metric = describe(select_by)  # the plots' axes name what chose
        plots = plot_metric_vs_params(trials, space, output / "plots", metric)
        plots.append(plot_learning_curves(trials, output / "plots", metric))
        summary["plots"] = [str(p) for p in plots]
    write_text_atomic(output / "summary.json", json.dumps(summary, indent=2, default=str))
    summary["table_markdown"] = trials_markdown(rows)
    return summary


def format_summary(summary: dict) -> str:
    lines = [summary["table_markdown"], ""]
    if summary.get("best_trial"):
        test = summary.get("best_stsb_test")
        lines += [
            f"best trial:   {summary['best_trial']}  {describe(summary['select_by'])} "
            f"{summary['best_score']:.2f} at step {summary['best_step']}"
            + (f", exported model STS-B test {test:.2f}" if test is not None else ""),
            f"best values:  {summary['best_params']}",
            f"best config:  {summary['best_config']}",
        ]
        if summary.get("best_model"):
            lines.append(f"best model:   {summary['best_model']}")
    if summary["errored"]:
        lines.append(
            f"errored:      {', '.join(summary['errored'])} (see the table's error column)"
        )
    lines += [
        f"table:        {summary['table']} (+ .csv)",
        f"trials:       {summary['trials']}, {summary['max_concurrent_trials']} at a time, "
        f"{summary['per_trial']} each on {summary['cluster']}",
        f"wall time:    {summary['wall_s']:.0f} s (corpus read once: {summary['corpus_load_s']} s)",
    ]
    return "\n".join(lines)
