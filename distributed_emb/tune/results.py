"""What a search produced, read back from its storage (the same after a resume): one summary
per trial, the table sorted by the selection score, the best trial's config as a training YAML
and its best checkpoint exported as a model.

The selection score is what eval.select_by names (selection.py: STS-B dev Spearman, or
nDCG@10 on a split of eval.retrieval_dir), reported by every evaluation as `select_score`. A
trial's score is the best one among the checkpoints Ray Train kept for it (the best
`output.checkpoints_to_keep` by that score), not its last evaluation: ASHA stops trials at
different steps, and a run that peaked early still produced that model. Its evaluation
history comes from the loop state in its latest checkpoint, which survives restarts; Tune's
own per-trial results start afresh when a trial is resumed.
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.fs
import yaml
from ray.train import Checkpoint
from ray.tune import ExperimentAnalysis

from distributed_emb.config import TrainingConfig, to_dict
from distributed_emb.selection import SELECT_METRIC, STSB_DEV, describe, selected_metric
from distributed_emb.tables import markdown_table
from distributed_emb.train.checkpointing import STATE_FILE
from distributed_emb.train.driver import export_checkpoint
from distributed_emb.tune.search_space import apply_params

# Tune statuses → what happened, in the table's words.
COMPLETED, STOPPED, ERROR, INTERRUPTED, NOT_STARTED = (
    "completed",
    "stopped early",
    "error",
    "interrupted",
    "not started",
)


@dataclass
class TrialSummary:
    trial_id: str
    status: str  # one of COMPLETED, STOPPED, ERROR, INTERRUPTED, NOT_STARTED
    params: dict[str, Any]  # dotted key → sampled value
    history: list[tuple[int, float]] = field(default_factory=list)  # (step, select_score)
    best_step: int | None = None  # of the best kept checkpoint
    best_score: float | None = None
    best_checkpoint: str | None = None
    time_s: float | None = None
    error: str | None = None
    # Step of the report at which the scheduler stopped the trial. Its Train run may have
    # evaluated once more while being stopped: `last_step` (the run's) can be later.
    stopped_at: int | None = None

    @property
    def best(self) -> tuple[int, float] | None:
        return None if self.best_score is None else (self.best_step, self.best_score)

    @property
    def last_step(self) -> int | None:
        return self.history[-1][0] if self.history else None


@dataclass(frozen=True)
class KeptCheckpoint:
    path: str  # local path or URI
    step: int
    history: list  # the loop's evaluations up to this checkpoint: [{"step", SELECT_METRIC, ...}]


def kept_checkpoints(run_dir: str) -> list[KeptCheckpoint]:
    """The checkpoints Ray Train kept in one run directory (local or s3:// / gs://)."""
    filesystem, root = pyarrow.fs.FileSystem.from_uri(run_dir)
    selector = pyarrow.fs.FileSelector(root, allow_not_found=True)
    kept = []
    for info in filesystem.get_file_info(selector):
        if info.type != pyarrow.fs.FileType.Directory or not info.base_name.startswith(
            "checkpoint_"
        ):
            continue
        state_path = f"{info.path}/{STATE_FILE}"
        if filesystem.get_file_info(state_path).type != pyarrow.fs.FileType.File:
            continue  # a checkpoint cut short (its worker was killed while writing it)
        with filesystem.open_input_stream(state_path) as handle:
            state = json.loads(handle.readall())
        kept.append(KeptCheckpoint(f"{run_dir}/{info.base_name}", state["step"], state["history"]))
    return sorted(kept, key=lambda c: c.step)


def summarize_trial(
    trial_id: str, status: str, params: dict, reports: list[dict], run_dir: str
) -> TrialSummary:
    """One trial from its Tune reports and its Train run's kept checkpoints."""
    summary = TrialSummary(trial_id, status, params)
    checkpoints = kept_checkpoints(run_dir)
    if checkpoints:
        rows = checkpoints[-1].history  # the latest checkpoint's history holds every evaluation
    else:
        rows = reports  # no checkpoint (e.g. storage gone): what Tune recorded
    summary.history = [
        (int(r["step"]), float(r[SELECT_METRIC]))
        for r in rows
        if _number(r.get(SELECT_METRIC)) is not None
    ]
    scores = dict(summary.history)
    scored = [c for c in checkpoints if c.step in scores]
    if scored:
        # The later step on a tie: selection.best_row's rule, so a trial exports what the same
        # run as a training job would.
        best = max(scored, key=lambda c: (scores[c.step], c.step))
        summary.best_step, summary.best_score = best.step, scores[best.step]
        summary.best_checkpoint = best.path
    if reports:
        summary.time_s = _number(reports[-1].get("time_total_s"))
    if status == STOPPED:
        summary.stopped_at = int(reports[-1]["step"])
    if status == NOT_STARTED and summary.history:
        summary.status = INTERRUPTED  # it trained, but Tune had no report of it yet
    return summary


def _status(tune_status: str, reports: list[dict]) -> str:
    if tune_status == "ERROR":
        return ERROR
    if tune_status == "TERMINATED":
        # The loop marks its last evaluation `final`; the scheduler stops a trial right after
        # a report that is not. (No report at all: a resumed run that had nothing left to do.)
        return COMPLETED if not reports or reports[-1].get("final") else STOPPED
    return INTERRUPTED if reports else NOT_STARTED


EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(Error|Exception|Failure|Interrupt)\b.*")


def _error_line(text: str | None) -> str | None:
    """One line from a Tune error trace: the raised exception (the last `pkg.SomeError: ...`
    line) and the first two sentences after it (Ray puts the cause there), shortened."""
    if not text:
        return None
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return None
    raised = [i for i, line in enumerate(lines) if EXCEPTION_LINE.fullmatch(line)]
    start = raised[-1] if raised else len(lines) - 1
    sentences = [line for line in lines[start + 1 :] if line.endswith(".")][:2]
    line = " / ".join([lines[start], *sentences])
    return line if len(line) <= 240 else line[:237] + "..."


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def summarize_trials(experiment_path: str, train_storage: str, name: str) -> list[TrialSummary]:
    """Every trial of the experiment, in trial-id order. A trial's Train run is
    `<train_storage>/<name>-<trial id>` (the run name tune/driver.py gives it)."""
    analysis = ExperimentAnalysis(experiment_path)
    frames = analysis.trial_dataframes
    summaries = []
    for trial in sorted(analysis.trials, key=lambda t: t.trial_id):
        frame = frames.get(trial.trial_id)
        reports = [] if frame is None or frame.empty else frame.to_dict("records")
        summary = summarize_trial(
            trial.trial_id,
            _status(trial.status, reports),
            dict(trial.config),
            reports,
            f"{train_storage.rstrip('/')}/{name}-{trial.trial_id}",
        )
        if trial.status == "ERROR":
            summary.error = _error_line(trial.get_error())
        summaries.append(summary)
    return summaries


def ranked(trials: list[TrialSummary]) -> list[TrialSummary]:
    """Best selection score first; trials without a score (errored early, not started) last."""
    return sorted(
        trials,
        key=lambda t: (t.best_score is None, -(t.best_score or 0.0), t.trial_id),
    )


def best_trial(trials: list[TrialSummary]) -> TrialSummary | None:
    """The best-scoring trial with a checkpoint; errored trials only when no other has one
    (their checkpoints are sound, but a run that crashed is a weaker recommendation)."""
    scored = [t for t in ranked(trials) if t.best_checkpoint is not None]
    healthy = [t for t in scored if t.status != ERROR]
    return (healthy or scored or [None])[0]


def _format(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def score_column(select_by: str) -> str:
    """The table's column of each trial's best score, named after what it is:
    `stsb_dev_best`, `retrieval_dev_ndcg_at_10_best`."""
    return f"{STSB_DEV if select_by == STSB_DEV else selected_metric(select_by)}_best"


def table_rows(
    trials: list[TrialSummary], keys: list[str], select_by: str = STSB_DEV
) -> list[dict[str, Any]]:
    rows = []
    for rank, trial in enumerate(ranked(trials), start=1):
        best = trial.best
        rows.append(
            {
                "rank": rank,
                "trial": trial.trial_id,
                "status": trial.status,
                **{key: trial.params.get(key) for key in keys},
                score_column(select_by): round(best[1], 2) if best else None,
                "best_step": best[0] if best else None,
                "last_step": trial.last_step,
                "stopped_at": trial.stopped_at,
                "time_s": round(trial.time_s, 1) if trial.time_s is not None else None,
                "error": trial.error,
            }
        )
    return rows


def trials_markdown(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no trials)"
    columns = list(rows[0])
    return markdown_table(columns, ([_format(row[c]) for c in columns] for row in rows))


def write_table(rows: list[dict[str, Any]], output: Path) -> tuple[Path, Path]:
    output.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = output / "results.csv", output / "results.md"
    with csv_path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else ["rank"])
        writer.writeheader()
        writer.writerows(rows)
    md_path.write_text(trials_markdown(rows) + "\n")
    return csv_path, md_path


def best_training_config(base: TrainingConfig, trial: TrialSummary, output: Path) -> TrainingConfig:
    """The base config with the best trial's values; trains into <output>/best_run."""
    config = apply_params(base, trial.params, where=f"trial {trial.trial_id}")
    config.output.dir = str(output / "best_run")
    config.output.run_name = None
    config.output.storage_path = base.output.storage_path
    return config


def write_best_config(config: TrainingConfig, trial: TrialSummary, path: Path) -> Path:
    """A YAML that jobs/train_informin.py --config accepts (every key of TrainingConfig)."""
    step, score = trial.best
    header = (
        f"# Best trial of the search: {trial.trial_id}, {describe(config.eval.select_by)} "
        f"{score:.2f} at step {step}.\n"
        f"# Searched values: {', '.join(f'{k}={v!r}' for k, v in trial.params.items())}\n"
        f"# Train with: python jobs/train_informin.py --config {path}\n"
    )
    path.write_text(header + yaml.safe_dump(to_dict(config), sort_keys=False))
    return path


def export_best_model(config: TrainingConfig, trial: TrialSummary, output_dir: Path) -> str:
    """The best trial's best checkpoint as a sentence-transformers directory."""
    checkpoint = Checkpoint(trial.best_checkpoint)  # local path or s3:// / gs:// URI
    with checkpoint.as_directory() as directory:
        return export_checkpoint(config, directory, str(output_dir))
