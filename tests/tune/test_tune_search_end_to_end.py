"""A real search through jobs/tune_informin.py: tiny BERT, 4 trials of 2 Ray Train workers
each, ASHA on the 2 CPUs of a 2-core machine (so one trial at a time), tokenising in Ray Data
through the token cache — while one trial's worker process is SIGKILLed mid-training, and the
whole search is interrupted (Ctrl-C) while the next trial trains, then finished by `--resume`.

What it proves: the killed trial is listed as errored and the others still finish; an
interrupted search says how to resume and refuses to start over in its directory; the
resumption does not run an ended trial again, continues the interrupted one from its last
checkpoint and runs the trials that had not started; ASHA stopped exactly the trials that a
plain re-enactment of its rule stops; the best config is a TrainingConfig YAML with the best
trial's values; the best model is that trial's best checkpoint; plots are written; the search,
in both its processes, tokenised its corpus once.

One search for all of it: an interrupted search as a module of its own cost about 150
core-seconds, most of them a second Ray start and its trials' start-up. The interrupted run is
a process of its own (a Ctrl-C reaches a job's main thread); the refused rerun and the
resumption run in this process (`harness.jobs.run`, as `python jobs/tune_informin.py` runs
them). The interrupted trial's workers are stopped (SIGSTOP) before the Ctrl-C, once Ray Train
has registered one of its checkpoints and while no newer checkpoint of it is on storage (the
registry lags the storage): it cannot train on while the job winds down, so where it stood is
known (that checkpoint) whatever the machine's load.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pytest
from harness.jobs import run

from distributed_emb.config import TrainingConfig, load_config
from distributed_emb.paths import shipped_corpus
from distributed_emb.train.checkpointing import STATE_FILE

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
                workers = _our_train_workers()
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


def _our_train_workers() -> list[psutil.Process]:
    """The RayTrainWorker processes among this test's descendants (its job's Ray instance)."""
    return [
        p
        for p in psutil.Process(os.getpid()).children(recursive=True)
        if "RayTrainWorker" in " ".join(_cmdline(p))
    ]


def _reports(output: Path) -> dict[str, list[dict]]:
    """Each trial's reports to Tune, by trial id; a line still being written is left out."""
    reports = {}
    for path in sorted((output / "search").glob("trial_*/result.json")):
        rows = []
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                rows.append(json.loads(line))
        reports[path.parent.name.removeprefix("trial_")] = rows
    return reports


def _checkpoint_states(run_dir: Path) -> list[dict]:
    """A Train run's saved trainer states, oldest first."""
    states = [json.loads(p.read_text()) for p in run_dir.glob(f"checkpoint_*/{STATE_FILE}")]
    return sorted(states, key=lambda state: state["step"])


def _registered_steps(run_dir: Path) -> list[int]:
    """The steps of the checkpoints Ray Train has registered for a run (its checkpoint
    manager's snapshot on storage); none while the snapshot is absent or being written."""
    snapshot = run_dir / "checkpoint_manager_snapshot.json"
    try:
        results = json.loads(snapshot.read_text())["checkpoint_results"]
    except (OSError, json.JSONDecodeError, KeyError):
        return []
    return [result["metrics"]["step"] for result in results]


def _unfinished_on_storage(run_dir: Path) -> bool:
    """Whether every checkpoint a stopped Train run has on storage is complete and before its
    last step. Ray Train registers a checkpoint after its worker has written it, so the
    snapshot can be behind the storage: a worker stopped just after writing its last step's
    checkpoint has finished, and one stopped while writing leaves a checkpoint without its
    state. Either would make "the interrupted trial resumes from its checkpoint" untrue."""
    directories = list(run_dir.glob("checkpoint_*/"))
    try:
        states = _checkpoint_states(run_dir)  # only the checkpoints whose state is written
    except (OSError, json.JSONDecodeError, KeyError):
        return False
    return 0 < len(states) == len(directories) and states[-1]["step"] < MAX_STEPS


def _interrupted_run(args: list[str], output: Path, log: Path) -> dict:
    """The search in a process of its own: one trial's worker SIGKILLed at its first
    checkpoint (TrainWorkerKiller); once Ray Train has registered a checkpoint of another
    trial that has not finished, that trial's workers are stopped, and the job gets a SIGINT
    if the storage agrees that the trial has not finished (else its workers go on).
    Returns the job's exit status and the killed and the interrupted Train runs. The stopped
    processes are killed once the job is over (they are this test's, and nothing else would
    end them). Tune's result.json files are no signal here: Tune writes them buffered."""
    killer = TrainWorkerKiller(output / "ray_results")
    killer.start()
    interrupted, frozen = None, []
    with log.open("w") as handle:
        job = subprocess.Popen(
            [sys.executable, str(REPO / "jobs" / "tune_informin.py"), *args],
            cwd=REPO, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 900
        try:
            while job.poll() is None and time.monotonic() < deadline:
                if interrupted is None and killer.killed_run is not None:
                    training = [
                        run
                        for run in (output / "ray_results").glob("search-*")
                        if run.name != killer.killed_run
                        and 0 < len(steps := _registered_steps(run))
                        and max(steps) < MAX_STEPS
                    ]
                    if training:
                        frozen = _our_train_workers()
                        for worker in frozen:
                            with contextlib.suppress(psutil.Error):
                                worker.suspend()
                        if _unfinished_on_storage(training[0]):
                            interrupted = training[0].name
                            job.send_signal(signal.SIGINT)
                        else:  # it got further than its snapshot said: let it go on
                            for worker in frozen:
                                with contextlib.suppress(psutil.Error):
                                    worker.resume()
                            frozen = []
                time.sleep(0.1)
            code = job.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            killer.done.set()
            for worker in frozen:
                with contextlib.suppress(psutil.Error):
                    worker.kill()
            if job.poll() is None:  # only on a hung test: take the job's whole session down
                os.killpg(job.pid, signal.SIGKILL)
    return {"code": code, "killed": killer.killed_run, "interrupted": interrupted}


@pytest.fixture(scope="module")
def search(tmp_path_factory, tiny_bert_path):
    import ray

    assert not ray.is_initialized(), "the job must start its own Ray (with the State API)"
    work = tmp_path_factory.mktemp("tune_search")
    output = work / "out"
    args = [
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
    ]
    first = _interrupted_run(args, output, work / "first.log")
    first["log"] = (work / "first.log").read_text()
    first["started"] = {run.name for run in (output / "ray_results").glob("search-*")}
    before = _reports(output)
    first["reports"] = before
    first["result_files"] = {
        trial: (output / "search" / f"trial_{trial}" / "result.json").read_text()
        for trial in before
    }

    # Without --resume the directory is refused (nothing is overwritten), before Ray starts.
    with contextlib.redirect_stderr(io.StringIO()) as refused_err:
        refused_code = run("tune_informin", args)
    refused = {"code": refused_code, "err": refused_err.getvalue(), "ray": ray.is_initialized()}

    resumed_at = time.time()
    try:
        with contextlib.redirect_stderr(io.StringIO()) as resumed_log:
            code = run("tune_informin", ["--output", str(output), "--resume"])
    finally:
        ray.shutdown()
    summary = json.loads((output / "summary.json").read_text())
    with (output / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    return {
        "first": first,
        "refused": refused,
        "resumed_at": resumed_at,
        "code": code,
        "log": resumed_log.getvalue()[-3000:],
        "output": output,
        "summary": summary,
        "rows": rows,
        "reports": _reports(output),
        "killed": first["killed"],
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
        # This trial's own scores, consecutive evaluations of its log: a trial that ASHA stops
        # or that is killed may log one more evaluation than reached Tune, and Tune keeps a
        # resumed trial's results from the resumption on only (docs/TUNE.md, "Resume").
        logged = {r["step"]: r["stsb_dev_spearman"] for r in evals}
        steps = [r["step"] for r in reports]
        assert steps == [s for s in sorted(logged) if steps and s >= steps[0]][: len(steps)]
        for report in reports:
            assert logged[report["step"]] == pytest.approx(report["stsb_dev_spearman"])
        assert "STS-B dev Spearman" in (own / "run.log").read_text()
        assert list((own / "tensorboard").glob("events.out.tfevents.*"))
        assert list((output / "search" / f"trial_{trial}").glob("events.out.tfevents.*"))
    assert not (output / "train_log.jsonl").exists()  # nothing shared between trials


def test_a_killed_trial_is_listed_as_errored_and_the_others_finish(search):
    assert search["code"] == 0, search["log"]
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


def test_an_interrupted_search_says_how_to_resume_and_will_not_start_over(search):
    first, refused = search["first"], search["refused"]
    assert first["code"] == 130, first["log"][-3000:]
    assert "--resume" in first["log"]
    assert refused["code"] == 2 and "--resume" in refused["err"], refused["err"][-3000:]
    assert not refused["ray"]  # refused before Ray started


def test_the_resumption_runs_no_ended_trial_again_and_continues_the_interrupted_one(search):
    first, output = search["first"], search["output"]
    assert search["code"] == 0, search["log"]
    assert not search["summary"]["interrupted"] and search["summary"]["trials"] == 4
    assert first["interrupted"] is not None, "no trial was interrupted: " + first["log"][-3000:]
    interrupted = first["interrupted"].removeprefix("search-")
    # The killed trial had ended before the interrupt: it was not run again.
    killed = search["killed"].removeprefix("search-")
    result = output / "search" / f"trial_{killed}" / "result.json"
    after = result.read_text() if result.is_file() else None
    assert after == first["result_files"].get(killed)
    # The interrupted trial had not finished; it continued from its last checkpoint (one
    # restart) and evaluated every step once.
    steps_before = [report["step"] for report in first["reports"].get(interrupted, [])]
    assert not steps_before or max(steps_before) < MAX_STEPS
    state = _checkpoint_states(output / "ray_results" / f"search-{interrupted}")[-1]
    assert state["restarts"] == 1
    assert [row["step"] for row in state["history"]] == list(range(0, MAX_STEPS + 1, GRACE))
    # The trials that had not started by the interrupt ran in the resumption: two when the
    # second trial was interrupted, fewer when one went on past its snapshot (_interrupted_run).
    runs = {run.name for run in (output / "ray_results").glob("search-*")}
    assert len(runs) == 4 and first["started"] <= runs


def _asha_stops(reports: dict[str, list[dict]], resumed_at: float) -> set[str]:
    """ASHA's rule re-enacted from the trials' reports, in the order they happened (one
    trial at a time): at its first report at or past the rung (step 2), a trial stops if its
    score is below the median of the scores recorded there before it (reduction factor 2);
    its score is then recorded. Reports at max_t end the trial anyway. Tune does not save its
    scheduler's state: the resumed search's ASHA starts with nothing recorded and judges
    every trial afresh."""
    order = sorted(
        ((report["timestamp"], trial, index), report)
        for trial, rows in reports.items()
        for index, report in enumerate(rows)
    )
    recorded: list[float] = []
    judged: set[str] = set()
    stopped = set()
    fresh = False
    for (timestamp, trial, _), report in order:
        if not fresh and timestamp >= resumed_at:
            recorded, judged, fresh = [], set(), True
        if trial in judged or report["step"] >= MAX_STEPS or report["step"] < GRACE:
            continue
        score = report["select_score"]  # Tune's metric (eval.select_by's score)
        if recorded and score < statistics.median(recorded):
            stopped.add(trial)
        recorded.append(score)
        judged.add(trial)
    return stopped


def test_asha_stopped_exactly_the_trials_its_rule_stops(search):
    actual = {row["trial"] for row in search["rows"] if row["status"] == "stopped early"}
    assert actual == _asha_stops(search["reports"], search["resumed_at"])


def test_trials_ran_one_at_a_time_as_the_resources_allow(search):
    """2 CPUs: Ray Data's 1, then 2 workers (lowered to 0.5 CPU each) per trial, the driver on
    memory alone: one trial at a time (in each of the search's two processes)."""
    assert search["summary"]["max_concurrent_trials"] == 1
    spans = []
    for rows in search["reports"].values():
        for part in (
            [r for r in rows if r["timestamp"] < search["resumed_at"]],
            [r for r in rows if r["timestamp"] >= search["resumed_at"]],
        ):
            if part:
                spans.append((part[0]["timestamp"] - part[0]["time_this_iter_s"],
                              part[-1]["timestamp"]))  # fmt: skip
    spans.sort()
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
    state = json.loads((checkpoint / STATE_FILE).read_text())
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
