"""What a cloud does to a training run, on a cluster in a box (tests/harness/autoscaling_cluster.py)
with its storage on an S3-protocol server on 127.0.0.1: the run is killed mid-run together with
the node its rank 0 trained on, that node's output directory is gone, and the user submits the
same command again, with no run name and no flag.

Shape as in cluster/aws.yaml: a head with no CPU (the driver, the Train controller), worker
nodes of 3 CPUs, one kept up (the autoscaler replaces the lost one); 1 Train worker of 2 CPUs,
so rank 0 is on a worker node, never on the driver's.

One job, killed, and its resubmission serve every end-to-end assertion (why a run of its own:
the kill and the resubmission are what is tested). The unit tests below it cover the pieces
without Ray.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from distributed_emb.paths import shipped_corpus

REPO = Path(__file__).resolve().parents[2]
STEPS = 20  # long enough that the kill at step 8 comes mid-run, no longer
EVAL_STEPS = 4
KILL_AFTER_EVAL = 8  # killed once storage holds this evaluation and checkpoint 4 is registered


@dataclass
class CloudRun:
    bucket: str  # s3://<bucket>
    run_root: str  # s3://<bucket>/runs/<the derived run name>
    run_names: list[str]  # every run directory under runs/
    first_logs: str  # what the first (killed) job printed
    second_logs: str  # what the resubmission printed
    first_status: str  # the first job's status when it was killed
    killed_at_step: int  # the latest evaluation on storage when the node was killed
    killed_processes: int
    output: Path  # the driver's --output (deleted between the two jobs)
    wall_s: float


def _eval_steps(train_log: str | None) -> list[int]:
    rows = [json.loads(line) for line in (train_log or "").splitlines() if line.strip()]
    return [row["step"] for row in rows if row.get("kind") == "eval"]


def _job_status(cluster, submission_id: str) -> str:
    reply = requests.get(
        f"{cluster.dashboard_url}/api/jobs/{submission_id}",
        headers=cluster.auth_headers(),
        timeout=30,
    )
    reply.raise_for_status()
    return reply.json()["status"]


def _job_logs(cluster, submission_id: str) -> str:
    reply = requests.get(
        f"{cluster.dashboard_url}/api/jobs/{submission_id}/logs",
        headers=cluster.auth_headers(),
        timeout=30,
    )
    return reply.json().get("logs", "") if reply.ok else f"(no logs: {reply.status_code})"


@pytest.fixture(scope="module")
def cloud_run(tmp_path_factory, tiny_bert_path, s3):
    from harness.autoscaling_cluster import (
        RAY_CLI,
        job_runtime_env,
        kill_node,
        local_cluster,
        wait_for,
    )

    from distributed_emb import storage

    started = time.monotonic()
    tmp = tmp_path_factory.mktemp("cloud_run")
    corpus = tmp / "corpus.txt"
    lines = Path(shipped_corpus("wiki_sentences.txt")).read_text().splitlines()[:1000]
    corpus.write_text("\n".join(lines) + "\n")
    output = tmp / "run"
    bucket = s3.create_bucket(f"cloud-{secrets.token_hex(3)}")
    bucket_name = bucket.removeprefix("s3://")
    # No output.run_name and no train.max_failures: the defaults are what is tested.
    command = [
        sys.executable, str(REPO / "jobs" / "train_informin.py"),
        "--config", str(REPO / "jobs" / "configs" / "informin_tiny.yaml"),
        f"model.path={tiny_bert_path}",
        f"data.path={corpus}",
        "data.max_rows=null",
        "train.num_workers=1",
        "train.cpus_per_worker=2",
        f"train.max_steps={STEPS}",
        f"eval.eval_steps={EVAL_STEPS}",
        "eval.max_pairs=16",
        "logging.logging_steps=2",
        f"output.storage_path={bucket}/runs",
        "--output", str(output),
    ]  # fmt: skip

    def submit(*options: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [RAY_CLI, "job", "submit", "--address", cluster.dashboard_url, *options,
             "--runtime-env-json", job_runtime_env(s3.env), "--", *command],
            cwd=REPO, env=cluster.client_env(), capture_output=True, text=True, timeout=900,
        )  # fmt: skip

    def run_dirs() -> list[str]:
        return sorted({key.split("/")[1] for key in s3.keys(bucket_name, "runs/train-")})

    def stored_eval_steps() -> list[int]:
        names = run_dirs()
        if len(names) != 1:
            return []
        return _eval_steps(storage.read_text(f"{bucket}/runs/{names[0]}/logs/train_log.jsonl"))

    def registered_checkpoint_step() -> int:
        """The step of the newest checkpoint Ray Train has registered (what a restart resumes
        from), -1 before the first. Ray Train 2.60 keeps its registered checkpoints in
        checkpoint_manager_snapshot.json in the run's directory, rewritten after each one: a
        checkpoint directory on storage is not registered yet (on a loaded machine the
        evaluation after it reached storage first)."""
        names = run_dirs()
        if len(names) != 1:
            return -1
        path = f"{bucket}/runs/{names[0]}/checkpoint_manager_snapshot.json"
        if not storage.exists(path):
            return -1
        try:
            latest = json.loads(storage.read_text(path)).get("latest_checkpoint_result")
        except json.JSONDecodeError:  # being rewritten
            return -1
        return int((latest or {}).get("metrics", {}).get("step", -1))

    with local_cluster(
        worker_cpus=3, max_workers=2, min_workers=1, idle_timeout_minutes=0.2
    ) as cluster:
        wait_for(lambda: len(cluster.alive_worker_nodes()) == 1, 120, "the first worker node")
        first_id = f"cloud-{secrets.token_hex(3)}"
        queued = submit("--no-wait", "--submission-id", first_id)
        assert queued.returncode == 0, queued.stdout + queued.stderr
        # Mid-run: storage holds the evaluation at KILL_AFTER_EVAL, and Ray Train registered
        # the checkpoint of an evaluation past step 0 before the kill.
        wait_for(
            lambda: (max(stored_eval_steps(), default=-1) >= KILL_AFTER_EVAL
                     and registered_checkpoint_step() >= EVAL_STEPS
                     or _job_status(cluster, first_id) in ("SUCCEEDED", "FAILED", "STOPPED")),
            600, f"the evaluation at step {KILL_AFTER_EVAL} and a checkpoint past step 0",
            poll_s=0.2,
        )  # fmt: skip
        first_status = _job_status(cluster, first_id)
        killed_at = max(stored_eval_steps(), default=-1)
        rank0_nodes = sorted(
            actor["node_id"]
            for actor in cluster.state("actors", class_name="RayTrainWorker")
            if actor["state"] == "ALIVE"
        )
        assert len(rank0_nodes) == 1, (first_status, rank0_nodes)
        # The cloud: the node is lost and the job with it (the head kept, as on-demand).
        killed = kill_node(cluster, rank0_nodes[0])
        requests.post(
            f"{cluster.dashboard_url}/api/jobs/{first_id}/stop",
            headers=cluster.auth_headers(),
            timeout=30,
        )
        wait_for(
            lambda: _job_status(cluster, first_id) in ("STOPPED", "FAILED", "SUCCEEDED"),
            120, "the first job to stop",
        )  # fmt: skip
        first_logs = _job_logs(cluster, first_id)
        # The lost node's disk: rank 0 wrote run.log, train_log.jsonl and tensorboard/ there
        # (fake nodes share this machine's disk: the driver's copy goes too).
        shutil.rmtree(output, ignore_errors=True)
        second = submit()
        second_logs = second.stdout + second.stderr
        assert second.returncode == 0, second_logs[-6000:]
    wall = time.monotonic() - started
    names = run_dirs()
    print(f"cloud run: {wall:.0f} s; killed at evaluation {killed_at}; runs {names}")
    return CloudRun(
        bucket=bucket,
        run_root=f"{bucket}/runs/{names[0]}" if names else "",
        run_names=names,
        first_logs=first_logs,
        second_logs=second_logs,
        first_status=first_status,
        killed_at_step=killed_at,
        killed_processes=len(killed),
        output=output,
        wall_s=wall,
    )


@pytest.mark.slow
@pytest.mark.ray
def test_the_resubmitted_command_resumes_the_same_run_from_its_checkpoint(cloud_run):
    from distributed_emb import storage

    run = cloud_run
    assert run.first_status == "RUNNING" and run.killed_processes > 0, (
        f"the first job was not killed mid-run ({run.first_status})",
        run.first_logs[-4000:],
    )
    # One run, named from its settings: the resubmission found it with no output.run_name.
    assert len(run.run_names) == 1 and re.fullmatch(r"train-[0-9a-f]{12}", run.run_names[0]), (
        run.run_names
    )
    # Spot-ready by default: the count printed at start, on a cluster with remote storage.
    for logs in (run.first_logs, run.second_logs):
        assert "train.max_failures=3" in logs, logs[-4000:]
    metrics = json.loads(storage.read_text(f"{run.run_root}/metrics.json"))
    assert metrics["steps"] == STEPS
    assert metrics["restarts"] >= 1  # resumed from a checkpoint ...
    rows = [json.loads(line) for line in
            storage.read_text(f"{run.run_root}/logs/train_log.jsonl").splitlines()]  # fmt: skip
    evals = [row for row in rows if row["kind"] == "eval"]
    first = [row["step"] for row in evals if row["restarts"] == 0]
    again = [row["step"] for row in evals if row["restarts"] >= 1]
    # ... not from step 0: the second attempt's first evaluation is past the first's checkpoint.
    assert first[:3] == [0, EVAL_STEPS, 2 * EVAL_STEPS] and again, evals
    assert 0 < min(again) and min(again) > EVAL_STEPS, evals
    assert max(again) == STEPS and max(first) >= KILL_AFTER_EVAL
    assert f"resuming run '{run.run_names[0]}' from" in run.second_logs


@pytest.mark.slow
@pytest.mark.ray
def test_storage_holds_every_output_of_the_run_for_both_attempts(cloud_run):
    from distributed_emb import storage

    run = cloud_run
    root = run.run_root
    for name in (
        "metrics.json",
        "learning_curves.png",
        "model/config.json",
        "model/model.safetensors",
        "model/README.md",
        "logs/run.log",
        "logs/train_log.jsonl",
    ):
        assert storage.exists(f"{root}/{name}"), name
    events = storage.list_files(f"{root}/logs/tensorboard")
    assert len([e for e in events if "tfevents" in e]) >= 2, events  # one writer per attempt
    run_log = storage.read_text(f"{root}/logs/run.log")
    # Both drivers' lines (the count printed at start) and both rank 0s' evaluation lines.
    assert run_log.count("train.max_failures=3") == 2, run_log[-4000:]
    assert f"step {EVAL_STEPS}/{STEPS} STS-B dev Spearman" in run_log  # the first attempt's
    assert f"step {STEPS}/{STEPS} STS-B dev Spearman" in run_log  # the second attempt's
    stamps = [line[:23] for line in run_log.splitlines() if re.match(r"\d{4}-\d\d-\d\d ", line)]
    assert stamps == sorted(stamps)
    metrics = json.loads(storage.read_text(f"{root}/metrics.json"))
    assert metrics["model_uri"] == f"{root}/model"
    assert metrics["logs_uri"] == f"{root}/logs"
    # The head's output directory is a convenience copy, written again by the second driver.
    assert (run.output / "metrics.json").is_file() and (run.output / "model").is_dir()


# ---------------------------------------------------------------------------------------------
# The pieces, without Ray
# ---------------------------------------------------------------------------------------------


def test_run_logs_merge_in_time_order_and_keep_a_shared_record_once():
    from distributed_emb.tracking import merge_run_logs

    driver = (
        "2026-01-01 10:00:00,000 INFO a: driver starts\n"
        "2026-01-01 10:00:02,000 WARNING b: rank 0 line\n"  # the driver's file has it too
        "2026-01-01 10:00:03,000 ERROR a: failed\nTraceback (most recent call last):\n  boom\n"
    )
    rank0 = (
        "2026-01-01 10:00:01,000 WARNING b: step 1\n"
        "2026-01-01 10:00:02,000 WARNING b: rank 0 line"  # no final newline: a torn upload
    )
    merged = merge_run_logs([driver, rank0])
    assert merged.splitlines() == [
        "2026-01-01 10:00:00,000 INFO a: driver starts",
        "2026-01-01 10:00:01,000 WARNING b: step 1",
        "2026-01-01 10:00:02,000 WARNING b: rank 0 line",
        "2026-01-01 10:00:03,000 ERROR a: failed",
        "Traceback (most recent call last):",
        "  boom",
    ]


def test_stored_logs_continue_the_stored_train_log_and_merge_every_part(tmp_path):
    import logging

    from distributed_emb import storage
    from distributed_emb.tracking import StoredLogs, read_train_log

    location = str(tmp_path / "storage" / "run" / "logs")
    node_a, node_b = tmp_path / "a", tmp_path / "b"
    logger = logging.getLogger("distributed_emb.test_cloud_run")
    logger.setLevel(logging.WARNING)
    first = StoredLogs(location, "rank0", logger, node_a)
    first.continue_stored()
    node_a.mkdir()
    (node_a / "train_log.jsonl").write_text('{"kind": "eval", "step": 0}\n')
    (node_a / "tensorboard").mkdir()
    (node_a / "tensorboard" / "events.out.tfevents.1.a").write_bytes(b"a")
    logger.warning("first attempt")
    first.close()
    # Another node (node a is gone): it continues what storage holds, then appends.
    second = StoredLogs(location, "rank0", logger, node_b)
    second.continue_stored()
    assert (node_b / "train_log.jsonl").read_text() == '{"kind": "eval", "step": 0}\n'
    with (node_b / "train_log.jsonl").open("a") as handle:
        handle.write('{"kind": "eval", "step": 4}\n')
    logger.warning("second attempt")
    second.upload()
    second.close()
    assert [row["step"] for row in read_train_log(storage.join(location, "train_log.jsonl"))] == [
        0,
        4,
    ]
    run_log = storage.read_text(storage.join(location, "run.log"))
    assert run_log.index("first attempt") < run_log.index("second attempt")
    assert storage.exists(storage.join(location, "tensorboard", "events.out.tfevents.1.a"))
    assert not [h for h in logger.handlers if type(h).__name__ == "RecordedLines"]


@pytest.mark.parametrize(
    ("storage_path", "address", "expected"),
    [
        (None, None, 0),  # one machine
        ("/mnt/shared/runs", None, 0),
        ("s3://bucket/runs", None, 3),  # object storage: a cloud run
        (None, "10.0.0.1:6379", 3),  # joined a cluster
    ],
)
def test_max_failures_auto(monkeypatch, storage_path, address, expected):
    from distributed_emb.config import TrainingConfig, load_config
    from distributed_emb.train.resolved_run import resolve_max_failures

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    overrides = [f"output.storage_path={storage_path}"] if storage_path else []
    if address:
        overrides.append(f"ray.address={address}")
    config = load_config(TrainingConfig, None, overrides)
    assert config.train.max_failures is None
    resolve_max_failures(config)
    assert config.train.max_failures == expected
    given = load_config(TrainingConfig, None, [*overrides, "train.max_failures=1"])
    resolve_max_failures(given)
    assert given.train.max_failures == 1


def test_the_default_run_name_on_storage_follows_the_settings(tmp_path):
    from distributed_emb.config import TrainingConfig, load_config
    from distributed_emb.train.run_identity import resolve_run_name

    def name(*overrides):
        base = [f"output.storage_path={tmp_path}", f"output.dir={tmp_path / 'out'}"]
        return resolve_run_name(load_config(TrainingConfig, None, [*base, *overrides]))

    same = name()
    assert re.fullmatch(r"train-[0-9a-f]{12}", same)
    assert name("train.max_failures=5", "logging.logging_steps=3") == same  # plumbing
    assert name("train.learning_rate=1e-5") != same  # another run
    assert name("output.run_name=mine") == "mine"
    no_storage = load_config(TrainingConfig, None, [f"output.dir={tmp_path}"])
    assert resolve_run_name(no_storage) == "train"
