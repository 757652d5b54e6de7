"""SIGKILL a Ray Train worker process mid-run: the run restarts from its last checkpoint,
finishes the planned number of steps (FailureConfig(max_failures=1)), and within the epoch
trains no row twice and skips none, apart from the steps rolled back to the checkpoint (the
row ids every rank actually trained on are recorded with output.row_log)."""

import json
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest


def _our_train_workers() -> list[psutil.Process]:
    """RayTrainWorker processes of this test's Ray instance only (descendants of its raylet),
    never those of other Ray work on the machine."""
    import ray

    raylet_pids = {
        info.process.pid
        for info in ray._private.worker._global_node.all_processes.get("raylet", [])
    }
    workers = []
    for process in psutil.process_iter(["cmdline"]):
        if "RayTrainWorker" not in " ".join(process.info["cmdline"] or []):
            continue
        try:
            if any(parent.pid in raylet_pids for parent in process.parents()):
                workers.append(process)
        except psutil.NoSuchProcess:
            continue
    return workers


def _kill_a_worker_after_step(row_logs: Path, step: int, timeline: list, stop):
    """Wait until a rank has trained past `step` (its row log says so: checkpoints before it
    are registered by then), then SIGKILL one of this test's RayTrainWorker processes."""
    while not stop.is_set():
        logged = [
            json.loads(line)["step"]
            for path in row_logs.glob("rank*.jsonl")
            for line in path.read_text().splitlines()
            if line.strip()
        ]
        if logged and max(logged) > step:
            for process in _our_train_workers()[:1]:
                process.send_signal(signal.SIGKILL)
                timeline.append((time.time(), f"SIGKILL worker pid {process.pid}"))
                return
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.ray
def test_worker_killed_mid_run_resumes_and_finishes(ray_local, tmp_path, tiny_bert_path):
    from harness.epoch_reference import reference_batches
    from harness.row_log import kept_steps, resumed_from, row_log_records
    from harness.tiny_run import tiny_config, tiny_corpus

    from distributed_emb.train.driver import run_training

    config = tiny_config(
        tiny_bert_path,
        tiny_corpus(tmp_path / "corpus.txt", lines=400),
        tmp_path / "run",
        "data.max_rows=null",
        "train.max_steps=12",
        "eval.eval_steps=2",
        "eval.max_pairs=16",
        "train.max_failures=1",
        "output.checkpoints_to_keep=3",
        "output.row_log=true",
    )
    timeline = [(time.time(), "start")]
    stop = threading.Event()
    killer = threading.Thread(
        target=_kill_a_worker_after_step,
        args=(tmp_path / "run" / "trained_rows", 6, timeline, stop),
        daemon=True,
    )
    killer.start()
    try:
        run_training(config)
    finally:
        stop.set()
    timeline.append((time.time(), "finished"))
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    print("timeline:", [(round(t - timeline[0][0], 1), what) for t, what in timeline])

    assert any("SIGKILL" in what for _, what in timeline), "the worker was never killed"
    assert metrics["restarts"] == 1
    assert metrics["steps"] == 12
    steps = [row["step"] for row in metrics["history"]]
    assert steps == [0, 2, 4, 6, 8, 10, 12]  # no step repeated, none missing
    assert metrics["sentences_seen"] == 12 * 16
    assert Path(metrics["model_dir"]).is_dir()

    # Exact resume: what each rank trained, read back from its row log.
    records = row_log_records(tmp_path / "run")
    (resumed,) = resumed_from(records).values()
    assert resumed >= 2 and resumed % 2 == 0  # a checkpoint step
    steps = kept_steps(records)
    assert list(steps) == list(range(1, 13))
    rows = [row for step_rows in steps.values() for row in step_rows]
    assert len(rows) == len(set(rows)) == 12 * 16  # no row twice, none skipped
    assert {r["epoch"] for r in records} == {0}
    # And exactly the global batches the epoch's order has, step by step.
    expected = reference_batches(config)
    assert all(sorted(steps[k]) == sorted(expected[k - 1]) for k in steps)
    print(f"resumed from step {resumed}")
