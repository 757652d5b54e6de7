"""Scale-up under `ray job submit` on a cluster in a box (tests/harness/autoscaling_cluster.py).

The head offers no CPU and there are no worker nodes at first, as on cluster/aws.yaml. Each
fake worker node has 3 logical CPUs and each Train worker asks for 2 (standing in for "one GPU
per worker"), so the two Train workers cannot share a node: the autoscaler must start two
nodes, and each keeps one CPU for the Ray Data pipeline feeding its rank. Checkpoints and the
exported model go to an S3-protocol server on 127.0.0.1 and are read back by a process that
never joined the cluster; once the job is done, the idle nodes are scaled back down.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import requests
import yaml
from harness.autoscaling_cluster import (
    RAY_CLI,
    NodeWatcher,
    Timeline,
    base_env,
    local_cluster,
    wait_for,
)

from distributed_emb.paths import shipped_corpus

# Slow: a whole multi-node cluster and a submitted job (about 2 min on 2 cores).
pytestmark = [pytest.mark.ray, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
STEPS = 6


def job_runtime_env(extra_env: dict[str, str]) -> str:
    """cluster/runtime_env.yaml's switches plus `extra_env`, as JSON for `--runtime-env-json`
    (the CLI takes a file or JSON, not both), without its working_dir.

    Why no working_dir here: fake nodes share the head's session directory, so each node's
    runtime-env agent unpacks the job's package into the same path, and one of them replaced
    it (rmtree + unpack) under the running driver, whose working directory then no longer
    existed (FileNotFoundError from os.getcwd at export). Every fake node already imports this
    checkout (same machine, same venv); tests/jobs/test_job_submit.py covers `--working-dir`.
    """
    runtime_env = yaml.safe_load((REPO / "cluster" / "runtime_env.yaml").read_text())
    runtime_env.pop("working_dir", None)
    runtime_env.pop("excludes", None)
    runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **extra_env}
    return json.dumps(runtime_env)


def small_corpus(tmp_path: Path, rows: int = 400) -> Path:
    corpus = tmp_path / "corpus.txt"
    lines = Path(shipped_corpus("wiki_sentences.txt")).read_text().splitlines()[:rows]
    corpus.write_text("\n".join(lines) + "\n")
    return corpus


READ_BACK = textwrap.dedent(
    """
    import sys, tempfile
    import pyarrow.fs as pafs
    from sentence_transformers import SentenceTransformer

    uri = sys.argv[1]
    filesystem, path = pafs.FileSystem.from_uri(uri)
    local = tempfile.mkdtemp()
    pafs.copy_files(path, local, source_filesystem=filesystem,
                    destination_filesystem=pafs.LocalFileSystem())
    model = SentenceTransformer(local, device="cpu")
    print("shape", model.encode(["A cat sits on the mat.", "Stocks fell."]).shape)
    """
)


def test_job_scales_up_spreads_workers_keeps_state_on_s3_and_scales_down(
    tmp_path, tiny_bert_path, s3
):
    bucket = s3.create_bucket(f"runs-{secrets.token_hex(3)}")
    run_name = "scale-up"
    submission_id = f"scale-up-{secrets.token_hex(3)}"
    timeline = Timeline()
    with local_cluster(worker_cpus=3, max_workers=2, idle_timeout_minutes=0.2) as cluster:
        timeline.add("head up, 0 worker nodes")
        assert cluster.alive_worker_nodes() == []
        watcher = NodeWatcher(cluster, timeline)
        watcher.start()
        command = [
            RAY_CLI, "job", "submit",
            "--address", cluster.dashboard_url,
            "--submission-id", submission_id,
            "--runtime-env-json", job_runtime_env(s3.env),
            "--",
            "python", str(REPO / "jobs" / "train_informin.py"),
            "--config", str(REPO / "jobs" / "configs" / "informin_tiny.yaml"),
            f"model.path={tiny_bert_path}",
            f"data.path={small_corpus(tmp_path)}",
            "data.max_rows=null",
            "train.num_workers=2",
            "train.cpus_per_worker=2",
            f"train.max_steps={STEPS}",
            "eval.eval_steps=2",
            "eval.max_pairs=16",
            f"output.storage_path={bucket}/runs",
            f"output.run_name={run_name}",
            "--output", str(tmp_path / "run"),
        ]  # fmt: skip
        timeline.add("job submitted")
        submitted = subprocess.run(
            command,
            cwd=REPO,
            env=cluster.client_env(),
            capture_output=True,
            text=True,
            timeout=900,
        )
        logs = submitted.stdout + submitted.stderr
        timeline.add(f"job ended (ray job submit exit {submitted.returncode})")
        status = requests.get(
            f"{cluster.dashboard_url}/api/jobs/{submission_id}",
            headers=cluster.auth_headers(),
            timeout=30,
        ).json()
        train_workers = cluster.state("actors", class_name="RayTrainWorker")
        head = [node["node_id"] for node in cluster.state("nodes") if node["is_head_node"]]
        try:
            wait_for(lambda: not cluster.alive_worker_nodes(), 240, "idle nodes to scale down")
            scaled_down = True
        except TimeoutError:
            scaled_down = False
            timeline.add(f"autoscaler log:\n{cluster.log_tail(40)}")
        timeline.add("all worker nodes gone" if scaled_down else "nodes still up at deadline")
        watcher.stop()
    print(f"scale-up timeline:\n{timeline}")

    assert submitted.returncode == 0, logs[-6000:]
    assert status["status"] == "SUCCEEDED", (status, logs[-6000:])
    assert watcher.most == 2, f"the autoscaler never ran 2 worker nodes:\n{timeline}"
    worker_nodes = {actor["node_id"] for actor in train_workers}
    assert len(train_workers) == 2, train_workers
    assert len(worker_nodes) == 2, f"both Train workers ran on one node: {worker_nodes}"
    assert not worker_nodes & set(head), "a Train worker ran on the head"
    assert scaled_down, f"idle worker nodes were not scaled down:\n{timeline}"

    keys = s3.keys(bucket.removeprefix("s3://"), f"runs/{run_name}/")
    checkpoints = {key.split("/")[2] for key in keys if key.split("/")[2].startswith("checkpoint_")}
    assert checkpoints, f"no checkpoint on the storage path: {keys}"
    assert f"runs/{run_name}/model/config.json" in keys, keys
    assert f"runs/{run_name}/metrics.json" in keys, keys

    # A process that never joined the cluster: only the S3 endpoint and keys in its env.
    reader = subprocess.run(
        [sys.executable, "-c", READ_BACK, f"{bucket}/runs/{run_name}/model"],
        env={**base_env(), **s3.env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert reader.returncode == 0, reader.stderr[-3000:]
    assert "shape (2, 32)" in reader.stdout  # tiny BERT's hidden size
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["steps"] == STEPS
    assert metrics["model_uri"] == f"{bucket}/runs/{run_name}/model"
