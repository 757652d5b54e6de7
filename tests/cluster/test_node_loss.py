"""A whole worker node lost mid-run (a preempted spot instance), on a multi-node cluster in
this process (`ray.cluster_utils.Cluster`): Ray Train restores from the last checkpoint on the
S3-protocol storage path onto a replacement node, the run finishes its planned steps,
`restarts` counts the loss, and within the epoch no row is trained twice or skipped apart from
the rolled-back steps (each rank's row log, output.row_log).

Shape as in cluster/aws.yaml: a head with no CPU, worker nodes that each hold one Train worker
(3 CPUs, 2 per worker: two workers cannot share a node) plus a CPU for Ray Data. A third,
idle node stands in for the replacement the autoscaler would start after a spot loss (that
start is what tests/cluster/test_autoscaling.py covers; `Cluster.add_node` cannot be called
from a second thread while this process's driver trains: it hung there). The test removes the
node of a Train worker, raylet, object store and every worker process on it at once.
"""

from __future__ import annotations

import json
import secrets
import threading
from pathlib import Path

import psutil
import pytest
from cluster_fixture import Timeline

from distributed_emb.config import TrainingConfig, load_config
from distributed_emb.paths import shipped_corpus

# Slow: three Ray nodes and a restarted Train run (about 1.5 min on 2 cores).
pytestmark = [pytest.mark.ray, pytest.mark.slow]

STEPS = 12
NODE_CPUS = 3
OBJECT_STORE = 256 * 1024**2


def _raylet_pid(node) -> int:
    return node.all_processes["raylet"][0].process.pid


def _train_worker_nodes(nodes: list) -> list:
    """The nodes (of `nodes`) that run a RayTrainWorker process now."""
    raylets = {_raylet_pid(node): node for node in nodes}
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if "RayTrainWorker" not in " ".join(process.info["cmdline"] or []):
            continue
        try:
            for parent in process.parents():
                if parent.pid in raylets and raylets[parent.pid] not in found:
                    found.append(raylets[parent.pid])
        except psutil.NoSuchProcess:
            continue
    return found


def _max_logged_step(row_logs: Path) -> int:
    steps = [
        json.loads(line)["step"]
        for path in row_logs.glob("rank*.jsonl")
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    return max(steps, default=-1)


def _lose_a_node(cluster, row_logs: Path, after_step: int, timeline: Timeline, stop):
    """Once a rank has trained past `after_step` (the checkpoints before it are registered by
    then), remove a node running a Train worker; then note when a Train worker runs on the
    node that was idle until then (the replacement)."""
    while not stop.is_set():
        if _max_logged_step(row_logs) > after_step:
            break
        stop.wait(0.2)
    else:
        return
    busy = _train_worker_nodes(list(cluster.worker_nodes))
    idle = [node for node in cluster.worker_nodes if node not in busy]
    if not busy or not idle:
        timeline.add(f"cannot stage the loss: {len(busy)} busy, {len(idle)} idle nodes")
        return
    cluster.remove_node(busy[0])
    timeline.add(f"node removed (a rank had trained past step {after_step})")
    while not stop.is_set():
        if _train_worker_nodes(idle):
            timeline.add("Train worker group restored: a worker runs on the replacement node")
            return
        stop.wait(0.5)


def test_node_lost_mid_run_restores_on_a_replacement_node(tmp_path, tiny_bert_path, s3):
    import ray
    from ray.cluster_utils import Cluster

    from distributed_emb.train.trainer import run_training

    bucket = s3.create_bucket(f"runs-{secrets.token_hex(3)}")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "\n".join(Path(shipped_corpus("wiki_sentences.txt")).read_text().splitlines()[:400])
    )
    output = tmp_path / "run"
    config = load_config(
        TrainingConfig,
        "jobs/configs/informin_tiny.yaml",
        [
            f"model.path={tiny_bert_path}",
            f"data.path={corpus}",
            "data.max_rows=null",
            f"train.max_steps={STEPS}",
            "train.cpus_per_worker=2",
            "train.max_failures=1",
            "eval.eval_steps=2",
            "eval.max_pairs=16",
            "output.checkpoints_to_keep=3",
            "output.row_log=true",
            f"output.storage_path={bucket}/runs",
            "output.run_name=node-loss",
            f"output.dir={output}",
        ],
    )
    timeline = Timeline()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "object_store_memory": OBJECT_STORE},
    )
    stop = threading.Event()
    try:
        # Two nodes for the two Train workers, one idle (the replacement).
        for _ in range(3):
            cluster.add_node(num_cpus=NODE_CPUS, object_store_memory=OBJECT_STORE)
        # Ray Train's helpers in the workers otherwise guess the cluster's address, and pick
        # another one when the machine runs other Ray instances.
        ray.init(
            address=cluster.address, runtime_env={"env_vars": {"RAY_ADDRESS": cluster.address}}
        )
        cluster.wait_for_nodes()
        timeline.add("head + 3 worker nodes up")
        loser = threading.Thread(
            target=_lose_a_node,
            args=(cluster, output / "trained_rows", 6, timeline, stop),
            daemon=True,
        )
        loser.start()
        try:
            result = run_training(config)
        finally:
            stop.set()
            loser.join(timeout=60)
        timeline.add("run finished")
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(f"node-loss timeline:\n{timeline}")

    assert timeline.has("node removed"), f"no node was removed:\n{timeline}"
    assert timeline.has("Train worker group restored"), str(timeline)
    metrics = result.metrics
    assert metrics["restarts"] == 1
    assert metrics["steps"] == STEPS
    assert [row["step"] for row in metrics["history"]] == list(range(0, STEPS + 1, 2))
    assert metrics["sentences_seen"] == STEPS * 16  # 2 ranks × batch 8
    assert metrics["model_uri"] == f"{bucket}/runs/node-loss/model"
    assert s3.keys(bucket.removeprefix("s3://"), "runs/node-loss/model/config.json")

    # Exact resume, read back from what each rank actually trained.
    records = [
        json.loads(line)
        for path in sorted((output / "trained_rows").glob("rank*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    resumed_from = min(r["step"] for r in records if r["attempt"] == 1) - 1
    assert resumed_from >= 2 and resumed_from % 2 == 0, resumed_from  # a checkpoint step
    kept = [r for r in records if r["attempt"] == 1 or r["step"] <= resumed_from]
    rolled_back = [r for r in records if r["attempt"] == 0 and r["step"] > resumed_from]
    rows = [row for r in kept for row in r["rows"]]
    assert len(rows) == len(set(rows)) == STEPS * 16  # no row twice, none skipped
    assert {r["epoch"] for r in kept} == {0}
    print(f"resumed from step {resumed_from}; {len(rolled_back)} rank-batches rolled back")
