"""An interrupted search resumes: `jobs/tune_informin.py` is stopped with SIGINT (Ctrl-C)
while its second trial trains, then `--resume` finishes it. The finished trial is not run
again, the interrupted one continues from its last Train checkpoint, the third one runs.

Only the interrupted run is a process of its own (a Ctrl-C reaches a job's main thread); the
refused rerun and the resumption run in this process (`harness.jobs.run`, as `python
jobs/tune_informin.py` runs them), which saves two interpreter starts with their imports.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.jobs import run

pytestmark = [pytest.mark.slow, pytest.mark.ray]

REPO = Path(__file__).resolve().parents[2]
JOB = [sys.executable, str(REPO / "jobs" / "tune_informin.py")]


def _json_or_none(text: str):
    """A JSON document, or None for one still being written (empty or cut short)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _reports(output: Path, while_running: bool = False) -> dict[str, list[dict]]:
    """Each trial's reports. While the job runs, a line or file the job is writing
    right now may be cut short: it is left out then, and an error once the job is over."""
    parse = _json_or_none if while_running else json.loads
    reports = {}
    for path in sorted((output / "search").glob("trial_*/result.json")):
        rows = [parse(line) for line in path.read_text().splitlines() if line.strip()]
        reports[path.parent.name] = [row for row in rows if row is not None]
    return reports


def _run(args: list[str], log: Path, interrupt_when=None, timeout: float = 900) -> int:
    """Run the job in its own session; SIGINT it once `interrupt_when()` holds."""
    with log.open("w") as handle:
        job = subprocess.Popen(
            JOB + args, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        try:
            while job.poll() is None and time.monotonic() < deadline:
                if interrupt_when is not None and interrupt_when():
                    job.send_signal(signal.SIGINT)
                    interrupt_when = None
                time.sleep(0.1)
            return job.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            if job.poll() is None:  # only on a hung test: take the job's whole session down
                os.killpg(job.pid, signal.SIGKILL)


def _checkpoint_states(run_dir: Path, while_running: bool = False) -> list[dict]:
    """The saved trainer states, oldest first. While the job runs (or after it was
    interrupted mid-copy) a checkpoint being copied to storage may hold an empty state
    file; Ray has not registered that checkpoint, so it is not one yet."""
    parse = _json_or_none if while_running else json.loads
    states = []
    for checkpoint in sorted(run_dir.glob("checkpoint_*")):
        state = checkpoint / "trainer_state.json"
        if state.is_file() and (parsed := parse(state.read_text())) is not None:
            states.append(parsed)
    return sorted(states, key=lambda state: state["step"])


def test_interrupted_search_resumes_and_finishes(tmp_path, tiny_bert_path, capfd):
    from distributed_emb.paths import shipped_corpus

    corpus = tmp_path / "corpus.txt"
    lines = Path(shipped_corpus("wiki_sentences.txt")).read_text().splitlines()[:300]
    corpus.write_text("\n".join(lines) + "\n")
    output = tmp_path / "out"
    first_args = [
        "--config",
        str(REPO / "jobs" / "configs" / "tune_tiny.yaml"),
        "--num-samples",
        "3",
        "--output",
        str(output),
        f"model.path={tiny_bert_path}",
        f"data.path={corpus}",
        "tune.scheduler=fifo",  # every trial runs to its end: the outcome is known
        "train.max_steps=8",  # evaluations at 0, 2, 4, 6, 8: time to interrupt in between
        "train.num_workers=1",  # what is resumed is the search, not a worker group's shape
        "ray.num_cpus=2",  # the core count of the machines CI runs on
        "ray.object_store_memory_mb=512",
    ]
    train_runs = output / "ray_results"

    def second_trial_is_training() -> bool:
        reports = _reports(output, while_running=True)
        finished = [r for r in reports.values() if r and r[-1].get("final")]
        runs = train_runs.glob("search-*")
        checkpointed = [run for run in runs if _checkpoint_states(run, while_running=True)]
        return len(finished) == 1 and len(checkpointed) == 2

    code = _run(first_args, tmp_path / "first.log", interrupt_when=second_trial_is_training)
    log = (tmp_path / "first.log").read_text()
    assert code == 130, log[-3000:]
    assert "--resume" in log
    before = _reports(output)
    finished = [t for t, r in before.items() if r and r[-1].get("final")]
    assert len(finished) == 1
    finished_id = finished[0].removeprefix("trial_")
    finished_text = (output / "search" / finished[0] / "result.json").read_text()
    runs = {run.name.removeprefix("search-") for run in train_runs.glob("search-*")}
    (interrupted_id,) = runs - {finished_id}
    interrupted_states = _checkpoint_states(
        train_runs / f"search-{interrupted_id}",
        while_running=True,  # SIGINT may cut a copy
    )
    assert interrupted_states[-1]["step"] < 8

    # Without --resume the directory is refused (nothing is overwritten), before Ray starts.
    import ray

    assert not ray.is_initialized()
    capfd.readouterr()
    refused = run("tune_informin", first_args)
    refused_err = capfd.readouterr().err
    assert refused == 2 and "--resume" in refused_err, refused_err[-3000:]
    assert not ray.is_initialized()

    # The resumption starts its own Ray in this process, shut down before the next module.
    try:
        code = run("tune_informin", ["--output", str(output), "--resume"])
    finally:
        ray.shutdown()
    resume_log = capfd.readouterr()
    assert code == 0, (resume_log.out + resume_log.err)[-3000:]
    summary = json.loads((output / "summary.json").read_text())
    assert summary["trials"] == 3 and summary["errored"] == [] and not summary["interrupted"]
    table = (output / "results.md").read_text()
    assert table.count("| completed |") == 3
    # The finished trial was not run again.
    assert (output / "search" / finished[0] / "result.json").read_text() == finished_text
    # The interrupted trial continued from its last checkpoint (one restart) and evaluated
    # every step exactly once.
    final_state = _checkpoint_states(train_runs / f"search-{interrupted_id}")[-1]
    assert final_state["restarts"] == 1
    assert [row["step"] for row in final_state["history"]] == [0, 2, 4, 6, 8]
    assert (output / "best_config.yaml").is_file() and (output / "best_model").is_dir()
