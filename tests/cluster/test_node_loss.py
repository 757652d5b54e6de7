"""Whole worker nodes lost mid-run (preempted spot instances), on one multi-node cluster in
this process (`ray.cluster_utils.Cluster`) shared by two scenarios (a Train run losing a node
is tests/cluster/test_elastic.py: restored from the S3 checkpoint onto the nodes left, every
surviving step checked against the reference order):

- InfoCSE annotation: the annotation actors run on different nodes; a node lost while they
  work (its actor and the annotated blocks in its object store gone) leaves the mined pairs
  identical, row for row and in order, to an undisturbed run.
- Tune: a 2-trial search whose trials run on different nodes loses only a trial with work on
  the removed node; that trial resumes from its checkpoint and every trial reports to the end.

Shape as in cluster/aws.yaml: a head with no CPU, worker nodes of 3 CPUs that each hold one
2-CPU Train worker or annotation actor (standing in for one GPU per node: two cannot share a
node) plus a CPU for Ray Data. The third, idle node stands in for the replacement the
autoscaler would start after a spot loss (that start is what test_elastic.py covers;
`Cluster.add_node` cannot be called from a second thread while this process's driver
trains: it hung there). Between scenarios a fresh node replaces the one removed, so each
scenario starts from three worker nodes. One cluster for both saves its start-up and the
first import of torch in each node's workers (about a minute on 2 cores).
"""

from __future__ import annotations

import json
import secrets
import threading
from pathlib import Path

import psutil
import pytest
from harness.autoscaling_cluster import Timeline
from harness.ray_head import free_ports

from distributed_emb.config import load_config
from distributed_emb.paths import shipped_corpus

# Slow: four Ray nodes, a restarted Train run, an annotation and a search (about 4 min on
# 2 cores; see docs/OPERATIONS.md for the measured times).
pytestmark = [pytest.mark.ray, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
WORKER_NODES = 3
NODE_CPUS = 3
OBJECT_STORE = 256 * 1024**2
ANNOTATOR = "MapBatches(DocumentAnnotator)"  # in the names of the pool's actors and tasks


@pytest.fixture(scope="module")
def box(s3):
    """Head (0 CPU, dashboard on 127.0.0.1 for the State API) + 3 worker nodes, this process
    connected as the driver. Depends on `s3` so its endpoint is in every worker's env."""
    import ray
    from ray.cluster_utils import Cluster

    (dashboard_port,) = free_ports(1)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "object_store_memory": OBJECT_STORE,
            "include_dashboard": True,
            "dashboard_host": "127.0.0.1",
            "dashboard_port": dashboard_port,
        },
    )
    try:
        for _ in range(WORKER_NODES):
            cluster.add_node(num_cpus=NODE_CPUS, object_store_memory=OBJECT_STORE)
        # Ray Train's helpers in the workers otherwise guess the cluster's address, and pick
        # another one when the machine runs other Ray instances.
        ray.init(
            address=cluster.address, runtime_env={"env_vars": {"RAY_ADDRESS": cluster.address}}
        )
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture
def cluster(box):
    """The module's cluster with 3 worker nodes: a node the previous scenario removed is
    replaced first (from this thread: add_node hangs from another one)."""
    while len(box.worker_nodes) < WORKER_NODES:
        box.add_node(num_cpus=NODE_CPUS, object_store_memory=OBJECT_STORE)
    box.wait_for_nodes()
    return box


def _node_of(cluster, node_id: str):
    return next((node for node in cluster.worker_nodes if node.node_id == node_id), None)


def _actors(class_name: str) -> list:
    """Alive actors whose class name contains `class_name` (Ray Data names its pool's class
    after the operator, with any fused operators before it: `MapWorker(A->MapBatches(B))`)."""
    from ray.util.state import list_actors

    alive = list_actors(
        filters=[("state", "=", "ALIVE")], limit=10000, raise_on_missing_output=False
    )
    return [actor for actor in alive if class_name in actor.class_name]


def _raylet_pid(node) -> int:
    return node.all_processes["raylet"][0].process.pid


def small_corpus(tmp_path: Path, rows: int = 400) -> Path:
    corpus = tmp_path / "corpus.txt"
    lines = Path(shipped_corpus("wiki_sentences.txt")).read_text().splitlines()[:rows]
    corpus.write_text("\n".join(lines) + "\n")
    return corpus


# ---------------------------------------------------------------------------------------------
# InfoCSE annotation
# ---------------------------------------------------------------------------------------------


def _finished_annotation_tasks() -> dict[str, int]:
    """node id → annotation batches finished there so far."""
    from ray.util.state import list_tasks

    done: dict[str, int] = {}
    tasks = list_tasks(
        filters=[("state", "=", "FINISHED")], limit=10000, raise_on_missing_output=False
    )
    for task in tasks:
        if ANNOTATOR in task.name and task.node_id:
            done[task.node_id] = done.get(task.node_id, 0) + 1
    return done


def _lose_an_annotating_node(cluster, timeline: Timeline, stop, seen: dict):
    """Once annotation actors run on two nodes and one has finished a batch (its annotated
    blocks are in that node's object store), remove that node; then note the actor that
    replaces it."""
    while not stop.is_set():
        actors = _actors(ANNOTATOR)
        seen["actor_nodes"] = {actor.node_id for actor in actors}
        done = _finished_annotation_tasks()
        ready = [node for node in done if node in seen["actor_nodes"]]
        if len(seen["actor_nodes"]) >= 2 and ready:
            break
        stop.wait(0.2)
    else:
        return
    victim = _node_of(cluster, ready[0])
    if victim is None:
        timeline.add(f"cannot stage the loss: node {ready[0][-6:]} is not a worker node")
        return
    seen["removed"] = victim.node_id
    seen["batches_before"] = sum(done.values())
    cluster.remove_node(victim)
    timeline.add(
        f"node removed after {seen['batches_before']} batches annotated "
        f"({done[ready[0]]} on it); actors were on {len(seen['actor_nodes'])} nodes"
    )
    while not stop.is_set():
        alive = _actors(ANNOTATOR)
        if len(alive) >= 2 and all(a.node_id != seen["removed"] for a in alive):
            timeline.add("annotation actor restarted on another node")
            return
        stop.wait(0.5)


def test_annotation_node_lost_mid_run_mines_the_same_pairs(cluster, tmp_path, tiny_bert_path):
    import numpy as np
    import pyarrow as pa
    import ray

    from distributed_emb.infocse.annotate import (
        AnnotationConfig,
        annotate_documents,
        annotate_documents_locally,
    )
    from distributed_emb.infocse.annotation_tables import spread_keys
    from distributed_emb.infocse.idc import IDCConfig
    from distributed_emb.infocse.pairs import read_pairs

    lines = Path(shipped_corpus("lee_documents.jsonl")).read_text().splitlines()[:120]
    documents = [
        {"doc_id": row["id"], "sentences": row["sentences"]}
        for row in (json.loads(line) for line in lines)
    ]
    config = AnnotationConfig(
        pooler="mean",
        concurrency=2,
        num_cpus_per_actor=2,  # one actor per 3-CPU node, as one per GPU node
        documents_per_batch=2,  # 60 small batches: the loss lands mid-run
        idc=IDCConfig(top_k=2, max_pairs_per_cluster=3, seed=5),
    )
    timeline = Timeline()
    timeline.add(f"head + {len(cluster.worker_nodes)} worker nodes up")
    stop, seen = threading.Event(), {}
    loser = threading.Thread(
        target=_lose_an_annotating_node, args=(cluster, timeline, stop, seen), daemon=True
    )
    loser.start()
    try:
        result = annotate_documents(
            ray.data.from_items(documents),
            tiny_bert_path,
            str(tmp_path / "pairs"),
            round_index=1,
            config=config,
        )
    finally:
        stop.set()
        loser.join(timeout=60)
    timeline.add("annotation finished")
    print(f"annotation node-loss timeline:\n{timeline}")

    assert "removed" in seen, f"annotation ended before a node was lost:\n{timeline}"
    assert len(seen["actor_nodes"]) >= 2, seen
    batches = len(documents) // config.documents_per_batch
    assert seen["batches_before"] < batches, "the loss came after the last batch"
    # The undisturbed run: one process, every document alone (tests/infocse/test_annotate.py
    # shows it equals an undisturbed Ray run), in the spread order annotate_documents writes.
    reference, undisturbed = annotate_documents_locally(
        documents, tiny_bert_path, round_index=1, config=config
    )
    keys = spread_keys(pa.Table.from_pylist(reference), seed=config.idc.seed + 1)
    expected = [reference[i] for i in np.argsort(keys, kind="stable")]
    mined = read_pairs(str(tmp_path / "pairs"))
    assert len(mined) == len(expected) > 0
    assert mined == expected  # same pairs, none twice, none lost, same order
    assert result.counts == undisturbed.counts
    assert result.counts.documents == len(documents)


# ---------------------------------------------------------------------------------------------
# Tune
# ---------------------------------------------------------------------------------------------

TUNE_STEPS = 12


def _trainer_states(s3, bucket: str) -> dict[str, list[dict]]:
    """Train run name ("search-<trial id>") → trainer_state.json of each of its checkpoints on
    the storage path (`<bucket>/runs/<run name>/checkpoint_*`), by step."""
    client = s3.client()
    states: dict[str, list[dict]] = {}
    for key in s3.keys(bucket, "runs/search-"):
        if key.endswith("/trainer_state.json") and "/checkpoint_" in key:
            run = key.split("/")[1]
            body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
            states.setdefault(run, []).append(json.loads(body))
    return {run: sorted(found, key=lambda s: s["step"]) for run, found in states.items()}


def _trial_worker_nodes(cluster) -> dict[str, object]:
    """Train run name ("search-<trial id>") → the node its rank-0 worker runs on now. Rank 0
    keeps its trial's run.log open (`<output>/trials/<run name>/run.log`): that names the trial."""
    raylets = {_raylet_pid(node): node for node in cluster.worker_nodes}
    found = {}
    for process in psutil.process_iter(["cmdline"]):
        if "RayTrainWorker" not in " ".join(process.info["cmdline"] or []):
            continue
        try:
            logs = [f.path for f in process.open_files() if f.path.endswith("/run.log")]
            node = next((raylets[p.pid] for p in process.parents() if p.pid in raylets), None)
        except psutil.Error:
            continue
        for path in logs:
            if node is not None and Path(path).parent.parent.name == "trials":
                found[Path(path).parent.name] = node
    return found


def _lose_a_trial_node(cluster, s3, bucket: str, timeline: Timeline, stop, seen: dict):
    """Once both trials train on different nodes and one of them has a checkpoint after step
    0, remove that trial's node; note whether a trial driver or Train controller was on it,
    which actors it held and where any actor of the data path was."""
    while not stop.is_set():
        states = _trainer_states(s3, bucket)
        workers = _trial_worker_nodes(cluster)
        ready = [run for run, node in workers.items() if states.get(run, [{}])[-1].get("step", 0)]
        if len(workers) == 2 and len(set(workers.values())) == 2 and ready:
            break
        stop.wait(0.3)
    else:
        return
    victim = workers[ready[0]]
    alive = _actors("")  # one listing: where every actor is at the moment of the loss
    drivers = {
        a.node_id
        for a in alive
        if "ImplicitFunc" in a.class_name or "TrainController" in a.class_name
    }
    seen.update(
        worker_nodes=len(set(workers.values())),
        lost_run=ready[0],
        lost_at=states[ready[0]][-1]["step"],
        only_workers=victim.node_id not in drivers,
        actors_on_it=sorted(a.class_name for a in alive if a.node_id == victim.node_id),
        data_actor_nodes=sorted(a.node_id for a in alive if "DropCounter" in a.class_name),
        rank0_nodes=sorted(node.node_id for node in workers.values()),
    )
    cluster.remove_node(victim)
    timeline.add(
        f"node removed: trial run {ready[0]} (checkpoint at step {seen['lost_at']}) trained "
        f"there; trials on 2 nodes; a trial driver on it: {not seen['only_workers']}; "
        f"actors on it: {seen['actors_on_it']}"
    )
    while not stop.is_set():
        if ready[0] in _trial_worker_nodes(cluster):
            timeline.add(f"{ready[0]} trains again, on another node")
            return
        stop.wait(0.5)


def test_tune_node_lost_mid_search_resumes_only_the_trial_on_it(
    cluster, tmp_path, tiny_bert_path, s3
):
    from ray import tune as ray_tune

    from distributed_emb.tune.driver import run_search
    from distributed_emb.tune.search_config import SearchJobConfig

    bucket = s3.create_bucket(f"runs-{secrets.token_hex(3)}")
    config = load_config(
        SearchJobConfig,
        str(REPO / "jobs" / "configs" / "tune_tiny.yaml"),
        [
            f"model.path={tiny_bert_path}",
            f"data.path={small_corpus(tmp_path, 300)}",
            "train.num_workers=1",
            "train.cpus_per_worker=2",  # one trial per node
            f"train.max_steps={TUNE_STEPS}",
            "train.max_failures=1",  # a lost Train worker: Train restores the trial's run
            "tune.max_failures=1",  # a lost trial driver: Tune retries, Train resumes
            "tune.num_samples=2",
            "tune.scheduler=fifo",  # both trials run to the end: the outcome is known
            "eval.eval_steps=2",
            f"output.storage_path={bucket}/runs",
            f"output.dir={tmp_path / 'search'}",
        ],
    )
    name = bucket.removeprefix("s3://")
    timeline = Timeline()
    timeline.add(f"head + {len(cluster.worker_nodes)} worker nodes up")
    stop, seen = threading.Event(), {}
    loser = threading.Thread(
        target=_lose_a_trial_node, args=(cluster, s3, name, timeline, stop, seen), daemon=True
    )
    loser.start()
    try:
        search = run_search(config)
    finally:
        stop.set()
        loser.join(timeout=60)
    timeline.add("search finished")
    print(f"Tune node-loss timeline:\n{timeline}")

    assert "lost_run" in seen, f"the search ended before a node was lost:\n{timeline}"
    assert seen["worker_nodes"] == 2, f"the trials shared a node: {seen}"
    # The search's trials read its token shards, built before any trial started: every rank
    # reads its own rows and no actor of the data path outlives the build, so a lost node
    # takes nothing of another run.
    assert seen["data_actor_nodes"] == [], seen
    assert not search.interrupted
    analysis = ray_tune.ExperimentAnalysis(search.experiment_path)
    assert [t.status for t in analysis.trials] == ["TERMINATED"] * 2
    for trial in analysis.trials:
        assert trial.last_result["step"] == TUNE_STEPS, trial.last_result

    states = _trainer_states(s3, name)
    assert len(states) == 2, states.keys()
    final = {run: found[-1] for run, found in states.items()}
    for run, state in final.items():
        # Every evaluation exactly once: a resumed trial continued, it did not start over.
        history = [row["step"] for row in state["history"]]
        assert history == list(range(0, TUNE_STEPS + 1, 2)), (run, history)
    restarted = sorted(run for run, state in final.items() if state["restarts"] > 0)
    assert seen["lost_run"] in restarted, (seen, final)
    if seen["only_workers"]:  # the removed node held one trial's worker and nothing else
        assert restarted == [seen["lost_run"]], final
    for run in restarted:
        assert final[run]["restarts"] == 1, final[run]
    # What Tune was told: each evaluation once per trial. A trial that started over instead
    # of resuming from its checkpoint would report step 0 again.
    for trial in analysis.trials:
        key = f"runs/search/trial_{trial.trial_id}/result.json"  # Tune's log of the reports
        text = s3.client().get_object(Bucket=name, Key=key)["Body"].read().decode()
        reported = [json.loads(line)["step"] for line in text.splitlines() if line.strip()]
        assert reported == list(range(0, TUNE_STEPS + 1, 2)), (trial.trial_id, reported)
