"""Results of a search from trial summaries: ranking, statuses, the table files, the best
config as a loadable training YAML, and the plots."""

from __future__ import annotations

import csv
import json

import pytest

from distributed_emb.config import TrainingConfig, load_config, to_dict
from distributed_emb.tune.results import (
    COMPLETED,
    ERROR,
    INTERRUPTED,
    NOT_STARTED,
    STOPPED,
    TrialSummary,
    _error_line,
    _status,
    best_training_config,
    best_trial,
    ranked,
    summarize_trial,
    table_rows,
    trials_markdown,
    write_best_config,
    write_table,
)
from distributed_emb.tune.search_plots import plot_learning_curves, plot_metric_vs_params
from distributed_emb.tune.search_space import parse_search_space

KEYS = ["loss.reconstruction_weight", "train.batch_size"]


def summary(trial_id, status, params, history, best=None, checkpoint=None, time_s=None, error=None):
    step, score = best if best else (None, None)
    return TrialSummary(trial_id, status, params, history, step, score, checkpoint, time_s, error)


@pytest.fixture
def trials() -> list[TrialSummary]:
    return [
        summary(
            "t0",
            COMPLETED,
            {KEYS[0]: 0.1, KEYS[1]: 16},
            [(0, 70.0), (10, 74.0), (20, 73.0)],
            (10, 74.0),
            "/ckpt/t0-10",
            40.0,
        ),
        summary(
            "t1",
            STOPPED,
            {KEYS[0]: 2.0, KEYS[1]: 32},
            [(0, 70.0), (10, 71.0)],
            (10, 71.0),
            "/ckpt/t1-10",
            20.0,
        ),
        summary(
            "t2",
            ERROR,
            {KEYS[0]: 0.5, KEYS[1]: 16},
            [],
            None,
            None,
            None,
            "ray.exceptions.ActorDiedError: The actor died unexpectedly",
        ),
        summary(
            "t3",
            COMPLETED,
            {KEYS[0]: 0.3, KEYS[1]: 32},
            [(0, 70.0), (10, 75.5), (20, 75.5)],
            (10, 75.5),
            "/ckpt/t3-10",
            41.0,
        ),
    ]


def write_checkpoint(run_dir, name, step, scores):
    directory = run_dir / name
    directory.mkdir(parents=True)
    history = [{"step": s, "select_score": v} for s, v in scores[: step // 2 + 1]]
    (directory / "trainer_state.json").write_text(json.dumps({"step": step, "history": history}))


def test_a_trials_best_is_its_best_kept_checkpoint_and_history_survives_restarts(tmp_path):
    """Evaluations at steps 0, 2, 4, 6 scored 5, 9, 9, 7; Ray Train kept the checkpoints of
    steps 4 and 6 (steps 2 and 4 tie; it dropped the earlier) plus a step-8 directory whose
    worker died mid-write. Tune's reports start afresh at the resume (only step 6)."""
    scores = [(0, 5.0), (2, 9.0), (4, 9.0), (6, 7.0)]
    run_dir = tmp_path / "search-t0"
    write_checkpoint(run_dir, "checkpoint_b", 4, scores)
    write_checkpoint(run_dir, "checkpoint_c", 6, scores)
    (run_dir / "checkpoint_d").mkdir()  # no trainer_state.json
    reports = [{"step": 6, "select_score": 7.0, "time_total_s": 12.5, "final": True}]
    trial = summarize_trial("t0", COMPLETED, {KEYS[0]: 0.1}, reports, str(run_dir))
    assert trial.history == scores
    assert trial.best == (4, 9.0) and trial.best_checkpoint == f"{run_dir}/checkpoint_b"
    assert trial.time_s == 12.5 and trial.last_step == 6
    # No run directory (nothing kept): the history is what Tune recorded, with no checkpoint.
    lost = summarize_trial("t1", STOPPED, {}, reports, str(tmp_path / "missing"))
    assert lost.history == [(6, 7.0)] and lost.best is None and lost.best_checkpoint is None
    assert lost.stopped_at == 6 and trial.stopped_at is None


def test_best_is_the_highest_score_over_all_evaluations_earliest_on_ties(trials):
    assert [t.trial_id for t in ranked(trials)] == ["t3", "t0", "t1", "t2"]  # unscored last
    assert best_trial(trials).trial_id == "t3"
    assert best_trial([trials[2]]) is None
    # an errored trial with a checkpoint is chosen only when no healthy trial has one
    errored = summary("t4", ERROR, {}, [(0, 99.0)], (0, 99.0), "/ckpt/t4-0")
    assert best_trial([*trials, errored]).trial_id == "t3"
    no_checkpoint = summary("t5", COMPLETED, {}, [(0, 80.0)], (0, 80.0), None)
    assert best_trial([no_checkpoint, errored]).trial_id == "t4"


@pytest.mark.parametrize(
    "tune_status, reports, expected",
    [
        ("TERMINATED", [{"final": False}, {"final": True}], COMPLETED),
        ("TERMINATED", [{"final": False}, {"final": False}], STOPPED),  # the scheduler's stop
        ("TERMINATED", [], COMPLETED),  # resumed after its last checkpoint: nothing left
        ("ERROR", [{"final": False}], ERROR),
        ("RUNNING", [{"final": False}], INTERRUPTED),
        ("PENDING", [], NOT_STARTED),
    ],
)
def test_status_from_tune_status_and_reports(tune_status, reports, expected):
    assert _status(tune_status, reports) == expected


def test_error_line_is_the_exception_of_the_trace():
    trace = (
        "Failure # 1 (occurred at 2026-01-01)\nTraceback (most recent call last):\n"
        '  File "x.py", line 3, in f\nray.train.TrainingFailedError: Training failed\n'
        "  worker rank 1 died\n"
    )
    assert _error_line(trace) == "ray.train.TrainingFailedError: Training failed"
    ray_trace = (
        '  File "trainer.py", line 195, in fit\n    raise result.error\n'
        "ray.train.WorkerGroupError: Training failed due to worker errors:\n"
        "[Rank 0 Error Snippet]:\nA worker health check failed.\nWorker info: Worker(\n"
        "  actor=Actor(RayTrainWorker, 68f7),\n)\n"
        "The actor died unexpectedly before finishing this task.\n\tclass_name: RayTrainWorker\n"
        "The actor is dead because its worker process has died.\n"
    )
    assert _error_line(ray_trace) == (
        "ray.train.WorkerGroupError: Training failed due to worker errors: / A worker health "
        "check failed. / The actor died unexpectedly before finishing this task."
    )
    assert _error_line(None) is None
    assert len(_error_line("ValueError: " + "x" * 500)) == 240


def test_table_files_hold_every_trial_sorted(trials, tmp_path):
    rows = table_rows(trials, KEYS)
    csv_path, md_path = write_table(rows, tmp_path)
    with csv_path.open() as handle:
        read = list(csv.DictReader(handle))
    assert [r["trial"] for r in read] == ["t3", "t0", "t1", "t2"]
    assert read[0]["stsb_dev_best"] == "75.5" and read[0]["best_step"] == "10"
    assert read[3]["status"] == "error" and "ActorDiedError" in read[3]["error"]
    assert read[3]["stsb_dev_best"] == ""
    lines = md_path.read_text().splitlines()
    assert lines[0].startswith("| rank | trial | status | loss.reconstruction_weight |")
    assert len(lines) == 2 + 4 and "| 1 | t3 | completed | 0.3 | 32 | 75.5 | 10 | 20 |" in lines[2]
    assert trials_markdown([]) == "(no trials)"
    # Chosen on a retrieval split (eval.select_by): the column says so.
    by_retrieval = table_rows(trials, KEYS, "retrieval:dev")
    assert by_retrieval[0]["retrieval_dev_ndcg_at_10_best"] == 75.5


def test_best_config_yaml_is_a_training_config_with_the_trials_values(trials, tmp_path):
    base = load_config(TrainingConfig, "jobs/configs/informin_default.yaml", [])
    config = best_training_config(base, trials[3], tmp_path)
    path = write_best_config(config, trials[3], tmp_path / "best_config.yaml")
    loaded = load_config(TrainingConfig, str(path), [])
    assert loaded.loss.reconstruction_weight == 0.3 and loaded.train.batch_size == 32
    assert loaded.output.dir == str(tmp_path / "best_run")
    # everything else is the base config
    expected = to_dict(base)
    expected["loss"]["reconstruction_weight"], expected["train"]["batch_size"] = 0.3, 32
    expected["output"]["dir"] = str(tmp_path / "best_run")
    assert to_dict(loaded) == expected
    assert path.read_text().startswith(
        "# Best trial of the search: t3, STS-B dev Spearman 75.50 at step 10"
    )


def test_plots_are_written_as_png(trials, tmp_path):
    space = parse_search_space(
        {
            KEYS[0]: {"type": "loguniform", "low": 0.04, "high": 4.0},
            KEYS[1]: {"type": "choice", "values": [16, 32]},
        },
        TrainingConfig(),
    )
    paths = plot_metric_vs_params(trials, space, tmp_path)
    paths.append(plot_learning_curves(trials, tmp_path))
    assert [p.name for p in paths] == [
        "metric_vs_loss_reconstruction_weight.png",
        "metric_vs_train_batch_size.png",
        "learning_curves.png",
    ]
    for path in paths:
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
