"""SIGKILL a Ray Train worker process mid-run: the run restarts from its last checkpoint and
finishes the planned number of steps (FailureConfig(max_failures=1))."""

import json
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from distributed_emb.config import TrainingConfig, load_config
from distributed_emb.paths import shipped_corpus


def _kill_a_worker_after_checkpoints(storage: Path, count: int, timeline: list, stop):
    """Wait until `count` checkpoints exist, then SIGKILL one RayTrainWorker process."""
    while not stop.is_set():
        checkpoints = list(storage.glob("*/checkpoint_*"))
        if len(checkpoints) >= count:
            for process in psutil.process_iter(["cmdline"]):
                cmdline = " ".join(process.info["cmdline"] or [])
                if "RayTrainWorker" in cmdline:
                    process.send_signal(signal.SIGKILL)
                    timeline.append((time.time(), f"SIGKILL worker pid {process.pid}"))
                    return
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.ray
def test_worker_killed_mid_run_resumes_and_finishes(ray_local, tmp_path, tiny_bert_path):
    from distributed_emb.train.trainer import run_training

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "\n".join(open(shipped_corpus("wiki_sentences.txt")).read().splitlines()[:400])
    )
    config = load_config(
        TrainingConfig,
        "jobs/configs/informin_tiny.yaml",
        [
            f"model.path={tiny_bert_path}",
            f"data.path={corpus}",
            "data.max_rows=null",
            "train.max_steps=12",
            "eval.eval_steps=2",
            "eval.max_pairs=16",
            "train.max_failures=1",
            "output.checkpoints_to_keep=3",
            f"output.dir={tmp_path / 'run'}",
        ],
    )
    timeline = [(time.time(), "start")]
    stop = threading.Event()
    killer = threading.Thread(
        target=_kill_a_worker_after_checkpoints,
        args=(tmp_path / "run" / "ray_results", 2, timeline, stop),
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
