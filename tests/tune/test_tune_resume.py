"""An interrupted search resumes: `jobs/tune_informin.py` is stopped with SIGINT (Ctrl-C)
while its second trial trains, then `--resume` finishes it. The finished trial is not run
again, the interrupted one continues from its last Train checkpoint, the third one runs.
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

pytestmark = [pytest.mark.slow, pytest.mark.ray]

REPO = Path(__file__).resolve().parents[2]
JOB = [sys.executable, str(REPO / "jobs" / "tune_informin.py")]


def _reports(output: Path) -> dict[str, list[dict]]:
    reports = {}
    for path in sorted((output / "search").glob("trial_*/result.json")):
        lines = path.read_text().splitlines()
        reports[path.parent.name] = [json.loads(line) for line in lines if line.strip()]
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


def _checkpoint_states(run_dir: Path) -> list[dict]:
    states = []
    for checkpoint in sorted(run_dir.glob("checkpoint_*")):
        state = checkpoint / "trainer_state.json"
        if state.is_file():
            states.append(json.loads(state.read_text()))
    return sorted(states, key=lambda state: state["step"])


def test_interrupted_search_resumes_and_finishes(tmp_path, tiny_bert_path):
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
        "ray.num_cpus=2",  # the core count of the machines CI runs on
        "ray.object_store_memory_mb=512",
    ]
    train_runs = output / "ray_results"

    def second_trial_is_training() -> bool:
        finished = [r for r in _reports(output).values() if r and r[-1].get("final")]
        checkpointed = [run for run in train_runs.glob("search-*") if _checkpoint_states(run)]
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
    assert _checkpoint_states(train_runs / f"search-{interrupted_id}")[-1]["step"] < 8

    # Without --resume the directory is refused (nothing is overwritten).
    refused = subprocess.run(JOB + first_args, cwd=REPO, capture_output=True, text=True)
    assert refused.returncode == 2 and "--resume" in refused.stderr

    code = _run(["--output", str(output), "--resume"], tmp_path / "resume.log")
    assert code == 0, (tmp_path / "resume.log").read_text()[-3000:]
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
