"""A real search through jobs/tune_informin.py: tiny BERT, 4 trials of 2 Ray Train workers
each, ASHA on the 2 CPUs of a 2-core machine (so one trial at a time), tokenising in Ray Data
through the token cache — while one trial's worker process is SIGKILLed mid-training.

What it proves: the killed trial is listed as errored and the others still finish; ASHA
stopped exactly the trials that a plain re-enactment of its rule stops; the best config is
a TrainingConfig YAML with the best trial's values; the best model is that trial's best
checkpoint; plots are written; the whole search tokenised its corpus once.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import statistics
import threading
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pytest
from harness.jobs import run

from distributed_emb.config import TrainingConfig, load_config
from distributed_emb.paths import shipped_corpus

pytestmark = [pytest.mark.slow, pytest.mark.ray]

REPO = Path(__file__).resolve().parents[2]
MAX_STEPS, GRACE = 4, 2  # jobs/configs/tune_tiny.yaml: evaluations at 0, 2, 4; ASHA rung at 2
CORPUS_ROWS = 256  # tune_tiny.yaml's data.max_rows of the 300 lines written


def tiny_corpus(directory: Path) -> Path:
    path = directory / "corpus.txt"
    lines = Path(shipped_corpus("wiki_sentences.txt")).read_text().splitlines()[:300]
    path.write_text("\n".join(lines) + "\n")
    return path


class TrainWorkerKiller(threading.Thread):
    """SIGKILLs one Ray Train worker process of this test's own Ray instance (a descendant of
    this process: other Ray instances on the machine are left alone) as soon as a trial has
    written its first checkpoint, i.e. while that trial is training."""

    def __init__(self, train_storage: Path):
        super().__init__(daemon=True)
        self.train_storage = train_storage
        self.killed_run: str | None = None  # Train run dir name: "search-<trial id>"
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            runs = sorted(self.train_storage.glob("*/checkpoint_*"))
            if runs:
                workers = [
                    p
                    for p in psutil.Process(os.getpid()).children(recursive=True)
                    if "RayTrainWorker" in " ".join(_cmdline(p))
                ]
                if workers:
                    self.killed_run = runs[0].parent.name
                    os.kill(min(w.pid for w in workers), signal.SIGKILL)
                    return
            time.sleep(0.05)


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


@pytest.fixture(scope="module")
def search(tmp_path_factory, tiny_bert_path):
    import ray

    assert not ray.is_initialized(), "the job must start its own Ray (with the State API)"
    work = tmp_path_factory.mktemp("tune_search")
    output = work / "out"
    killer = TrainWorkerKiller(output / "ray_results")
    killer.start()
    try:
        code = run(
            "tune_informin",
            [
                "--config",
                str(REPO / "jobs" / "configs" / "tune_tiny.yaml"),
                "--num-samples",
                "4",
                "--output",
                str(output),
                f"model.path={tiny_bert_path}",
                f"data.path={tiny_corpus(work)}",
                "ray.num_cpus=2",  # the core count of the machines CI runs on
                "ray.object_store_memory_mb=512",
            ],
        )
    finally:
        killer.done.set()
        ray.shutdown()
    summary = json.loads((output / "summary.json").read_text())
    with (output / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    reports = {
        path.parent.name.removeprefix("trial_"): [
            json.loads(line) for line in path.read_text().splitlines() if line.strip()
        ]
        for path in (output / "search").glob("trial_*/result.json")
    }
    return {
        "code": code,
        "output": output,
        "summary": summary,
        "rows": rows,
        "reports": reports,
        "killed": killer.killed_run,
    }


def test_each_trial_logs_into_its_own_directory_and_tune_writes_event_files(search):
    """Trials run side by side: each has its own run.log, train_log.jsonl and tensorboard/
    under trials/<run name>/ (docs/TUNE.md); Tune's own event files, one set per trial, hold
    the reported evaluations."""
    from distributed_emb.tracking import read_train_log

    output = search["output"]
    assert sorted(p.name for p in (output / "trials").iterdir()) == sorted(
        f"search-{trial}" for trial in search["reports"]
    )
    for trial, reports in search["reports"].items():
        own = output / "trials" / f"search-{trial}"
        evals = [r for r in read_train_log(own / "train_log.jsonl") if r["kind"] == "eval"]
        # This trial's own scores; a trial that ASHA stops or that is killed may log one more
        # evaluation than reached Tune.
        logged = {r["step"]: r["stsb_dev_spearman"] for r in evals}
        assert sorted(logged)[: len(reports)] == [r["step"] for r in reports]
        for report in reports:
            assert logged[report["step"]] == pytest.approx(report["stsb_dev_spearman"])
        assert "STS-B dev Spearman" in (own / "run.log").read_text()
        assert list((own / "tensorboard").glob("events.out.tfevents.*"))
        assert list((output / "search" / f"trial_{trial}").glob("events.out.tfevents.*"))
    assert not (output / "train_log.jsonl").exists()  # nothing shared between trials


def test_a_killed_trial_is_listed_as_errored_and_the_others_finish(search):
    assert search["code"] == 0
    assert search["killed"] is not None, "no Train worker was found to kill"
    killed_trial = search["killed"].removeprefix("search-")
    rows = {row["trial"]: row for row in search["rows"]}
    assert len(rows) == 4 and search["summary"]["trials"] == 4
    assert search["summary"]["errored"] == [killed_trial]
    assert rows[killed_trial]["status"] == "error" and rows[killed_trial]["error"]
    for trial, row in rows.items():
        if trial == killed_trial:
            continue
        assert row["status"] in ("completed", "stopped early")
        if row["status"] == "completed":
            assert int(row["last_step"]) == MAX_STEPS and not row["stopped_at"]
        else:  # stopped at the rung; the run may evaluate once more while being stopped
            assert int(row["stopped_at"]) == GRACE <= int(row["last_step"])


def test_table_is_sorted_by_best_dev_score_with_unscored_trials_last(search):
    scores = [row["stsb_dev_best"] for row in search["rows"]]
    numbers = [float(s) for s in scores if s]
    assert numbers == sorted(numbers, reverse=True)
    assert scores == [s for s in scores if s] + [s for s in scores if not s]
    assert (search["output"] / "results.md").read_text().count("\n") == 2 + 4


def _asha_stops(reports: dict[str, list[dict]]) -> set[str]:
    """ASHA's rule re-enacted from the trials' reports, in the order they happened (one
    trial at a time): at the first report at or past the rung (step 2), a trial stops if its
    score is below the median of the scores recorded there before it (reduction factor 2);
    its score is then recorded. Reports at max_t end the trial anyway."""
    reported = [trial for trial in reports if reports[trial]]  # a killed trial may have none
    order = sorted(reported, key=lambda trial: reports[trial][0]["timestamp"])
    recorded: list[float] = []
    stopped = set()
    for trial in order:
        for report in reports[trial]:
            if report["step"] >= MAX_STEPS or report["step"] < GRACE:
                continue
            score = report["select_score"]  # Tune's metric (eval.select_by's score)
            if recorded and score < statistics.median(recorded):
                stopped.add(trial)
            recorded.append(score)
            break
    return stopped


def test_asha_stopped_exactly_the_trials_its_rule_stops(search):
    actual = {row["trial"] for row in search["rows"] if row["status"] == "stopped early"}
    assert actual == _asha_stops(search["reports"])


def test_trials_ran_one_at_a_time_as_the_resources_allow(search):
    """2 CPUs: Ray Data's 1, then 2 workers (lowered to 0.5 CPU each) per trial, the driver on
    memory alone: one trial at a time."""
    assert search["summary"]["max_concurrent_trials"] == 1
    spans = sorted(
        (rows[0]["timestamp"] - rows[0]["time_this_iter_s"], rows[-1]["timestamp"])
        for rows in search["reports"].values()
        if rows
    )
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start >= end - 1  # timestamps are whole seconds


def test_best_config_and_model_are_the_best_trials(search, tiny_bert_path):
    from sentence_transformers import SentenceTransformer

    # The best trial is the top row that did not error (an errored trial's checkpoints are
    # only used when no other trial has one).
    summary = search["summary"]
    best_row = next(row for row in search["rows"] if row["status"] != "error")
    assert summary["best_trial"] == best_row["trial"]
    config = load_config(TrainingConfig, summary["best_config"], [])
    assert config.model.path == tiny_bert_path and config.train.max_steps == MAX_STEPS
    assert config.loss.reconstruction_weight == pytest.approx(
        float(best_row["loss.reconstruction_weight"])
    )
    assert config.train.learning_rate == pytest.approx(float(best_row["train.learning_rate"]))
    assert config.train.batch_size == int(best_row["train.batch_size"])

    # The exported model comes from the best trial's own Train run, at its best step.
    checkpoint = Path(summary["best_checkpoint"])
    assert checkpoint.parent.name == f"search-{best_row['trial']}"
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["step"] == int(best_row["best_step"])
    model = SentenceTransformer(summary["best_model"], device="cpu")
    assert model.encode(["a sentence", "another one"]).shape == (2, 32)


def test_plots_of_the_search_are_written(search):
    names = sorted(p.name for p in (search["output"] / "plots").glob("*.png"))
    assert names == [
        "learning_curves.png",
        "metric_vs_loss_reconstruction_weight.png",
        "metric_vs_train_batch_size.png",
        "metric_vs_train_learning_rate.png",
    ]


def test_the_trials_read_one_tokenising_pass(search):
    """The search's trials share one build of the corpus's token shards: the corpus is
    tokenised once for the whole search, and the trials' ranks read their rows from it."""
    from distributed_emb.data.indexed_shards import ShardIndex

    builds = sorted((search["output"] / "ray_results" / "token_cache").glob("*/data-*"))
    assert len(builds) == 1, builds  # one tokenising pass for the whole search
    commit = json.loads((builds[0].parent / "COMMIT.json").read_text())
    assert commit["data"] == builds[0].name and commit["rows"] == CORPUS_ROWS
    index = ShardIndex.from_list(str(builds[0]), commit["shards"])
    assert ShardIndex.scan(str(builds[0])) == index and index.rows == CORPUS_ROWS
    first = pa.ipc.open_file(str(builds[0] / index.shards[0][0])).schema.names
    assert "text" not in first and "text__ids" in first
    # The trials not killed trained on it to the ASHA rung at least (the killed one may have
    # reported only its step-0 evaluation).
    killed = search["killed"].removeprefix("search-")
    others = [rows for trial, rows in search["reports"].items() if trial != killed]
    assert len(others) == 3 and all(max(r["step"] for r in rows) >= GRACE for rows in others)
