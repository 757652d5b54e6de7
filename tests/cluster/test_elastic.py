"""An elastic worker group under `ray job submit` on a cluster in a box
(tests/harness/autoscaling_cluster.py), with its state on an S3-protocol server on 127.0.0.1:
the scale-up, node-loss and object-storage path of a real cluster in one job.

Shape as in cluster/aws.yaml: the head offers no CPU; fake worker nodes of 3 logical CPUs, one
up at the start; each Train worker asks for 2 CPUs (standing in for one GPU per node), so two
workers never share a node. The job asks for `train.num_workers=[1, 2]`:

1. it starts on the one worker node with 1 worker (the autoscaler may run 1 node: no spot
   capacity yet);
2. once its group is placed, capacity arrives (the autoscaler may run 2 nodes): Ray Train's
   request for its largest group makes the autoscaler add a second node and the group grows
   to 2 workers (a resize: it resumes from its last checkpoint). Capacity is held back until
   then because otherwise the second node may boot before the first group is placed, which
   is then placed at 2 (on a slow machine it was), and the growth would go unseen. The
   groups are followed as Ray places them (their RayTrainWorker actors), not only as they
   train: on a slow machine the second node is up before the first group's workers have
   imported torch, and Ray Train grows the group before it trains a step — still a growth;
3. the node of rank 1 is killed (a spot loss) and the group shrinks back to 1 worker;
4. the run finishes its steps; the idle node is scaled down afterwards.

Every step trains the same global batch of 16 rows whatever the group's size, and the row log
shows that the surviving steps trained exactly the epoch's global batches in order (the
single-process reference, tests/harness/epoch_reference.py): no row twice, none skipped. The
exported model is read back from the bucket by a process that never joined the cluster.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import requests
from harness.autoscaling_cluster import (
    RAY_CLI,
    NodeWatcher,
    Timeline,
    base_env,
    job_runtime_env,
    kill_node,
    local_cluster,
    wait_for,
)
from harness.row_log import kept_steps, resumed_from, row_log_records

from distributed_emb.paths import shipped_corpus

# Slow: a multi-node cluster, a submitted job and three worker groups (3–4 min on 2 cores).
pytestmark = [pytest.mark.ray, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
# Enough steps that the run outlasts the second node's start, Ray Train's noticing it (up to
# 20 s, the autoscaling coordinator's tick) and the resize: a step takes about a second on an
# idle 2-core machine, and with 24 steps the run finished on one worker before the grown group
# could start (the growth went unseen). On an idle machine the group grew after about 30 steps
# and its node was lost 3 steps later; every step after that is the shrunk group finishing
# (96 steps: 57 s of the run's 170 s), so 64 leaves the growth 30 steps of margin. A busy
# machine only adds margin: the steps slow down, the coordinator's tick does not.
STEPS = 64
GLOBAL_BATCH = 16  # train.batch_size 8 × at most 2 workers
STEPS_AT_TWO = 2  # steps the grown group trains before its node is killed


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


class GroupWatcher(threading.Thread):
    """Follows the run through the State API and its row log: records each worker group as it
    is placed and as it trains (attempt and size). Once the first group is placed and has a
    checkpoint, lets the autoscaler run a second node; once the group has grown to 2 and
    trained STEPS_AT_TWO steps, kills rank 1's node."""

    def __init__(self, cluster, output: Path, timeline: Timeline) -> None:
        super().__init__(daemon=True)
        self.cluster, self.output, self.timeline = cluster, output, timeline
        self.groups: dict[int, int] = {}  # attempt → ranks seen in its records
        # placement group → its RayTrainWorker actor ids, in the order groups were placed
        self.placed: dict[str, set[str]] = {}
        self.killed: list[int] = []
        self.capacity_added = False
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                records = row_log_records(self.output)
            except (OSError, ValueError):  # a line half written: read again
                records = []
            for attempt in sorted({r["attempt"] for r in records}):
                ranks = {r["rank"] for r in records if r["attempt"] == attempt}
                if len(ranks) > self.groups.get(attempt, 0):
                    self.groups[attempt] = len(ranks)
                    self.timeline.add(f"attempt {attempt} trains on {len(ranks)} worker(s)")
            self._follow_placement()
            # The second node only once the first group has a checkpoint (its second step has
            # started, so its first step's checkpoint was reported): a group resized before its
            # first checkpoint starts over instead of resuming, and the grow is to resume.
            first_steps = {r["step"] for r in records if r["attempt"] == 0}
            if not self.capacity_added and self.placed and len(first_steps) >= 2:
                self.cluster.set_max_workers(2)
                self.capacity_added = True
                self.timeline.add("capacity for a second node")
            grown = [a for a, size in self.groups.items() if size == 2]
            if grown and not self.killed:
                steps = {r["step"] for r in records if r["attempt"] == grown[0]}
                if len(steps) > STEPS_AT_TWO:
                    self._kill_rank_one()
            self._halt.wait(0.5)

    def _follow_placement(self) -> None:
        """Records each worker group Ray Train places, by its placement group (each group
        has its own) and the RayTrainWorker actors in it, dead ones included."""
        try:
            workers = self.cluster.state("actors", class_name="RayTrainWorker")
        except requests.RequestException:
            return
        for actor in workers:
            group = actor.get("placement_group_id")
            if not group:
                continue
            if group not in self.placed:
                self.placed[group] = set()
                self.timeline.add(f"worker group {len(self.placed)} placed")
            self.placed[group].add(actor["actor_id"])

    def placed_sizes(self) -> list[int]:
        return [len(actors) for actors in self.placed.values()]

    def _kill_rank_one(self) -> None:
        with_rank = [
            actor
            for actor in self.cluster.state("actors", class_name="RayTrainWorker")
            if actor["state"] == "ALIVE"
        ]
        nodes = sorted({actor["node_id"] for actor in with_rank})
        if len(nodes) < 2:
            return
        # Either node will do: each rank reads its own rows from the token shards, and the
        # new group restarts from the checkpoint's position. Kill the newer one (the grown
        # node).
        self.killed = kill_node(self.cluster, nodes[-1])
        self.timeline.add(f"killed node {nodes[-1][-5:]} ({len(self.killed)} processes)")

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)


def test_the_group_grows_with_the_autoscaler_shrinks_on_node_loss_and_trains_every_batch_once(
    tmp_path, tiny_bert_path, s3
):
    bucket = s3.create_bucket(f"runs-{secrets.token_hex(3)}")
    run_name = "elastic"
    submission_id = f"elastic-{secrets.token_hex(3)}"
    corpus = tmp_path / "corpus.txt"
    lines = Path(shipped_corpus("wiki_sentences.txt")).read_text().splitlines()[:4000]
    corpus.write_text("\n".join(lines) + "\n")
    output = tmp_path / "run"
    timeline = Timeline()
    # An idle node goes after 30 s, not sooner: Ray's autoscaling coordinator, through which
    # Ray Train sees new nodes, looks at the cluster every 20 s, and a second node that went
    # after 12 s idle was gone before Ray Train saw it (the growth went unseen).
    with local_cluster(
        worker_cpus=3, max_workers=1, min_workers=1, idle_timeout_minutes=0.5
    ) as cluster:
        wait_for(lambda: len(cluster.alive_worker_nodes()) == 1, 120, "the first worker node")
        timeline.add("head and 1 worker node up")
        nodes = NodeWatcher(cluster, timeline)
        nodes.start()
        groups = GroupWatcher(cluster, output, timeline)
        groups.start()
        overrides = [
            f"model.path={tiny_bert_path}",
            f"data.path={corpus}",
            "data.max_rows=null",
            "data.length_group_batches=0",
            "train.num_workers=[1,2]",
            "train.batch_size=8",
            "train.cpus_per_worker=2",
            # Restarts: the lost node. A resize is not a failure.
            "train.max_failures=3",
            "train.elastic_resize_interval_s=2",
            f"train.max_steps={STEPS}",
            # A checkpoint at every step: a resize or a loss rolls nothing back, and every
            # step's evaluation gives the run its pace.
            "eval.eval_steps=1",
            "eval.max_pairs=16",
            "output.checkpoints_to_keep=2",
            "output.row_log=true",
            f"output.storage_path={bucket}/runs",
            f"output.run_name={run_name}",
        ]
        command = [
            RAY_CLI, "job", "submit",
            "--address", cluster.dashboard_url,
            "--submission-id", submission_id,
            "--runtime-env-json", job_runtime_env({
                **s3.env,
                "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
                # After the loss, Ray Train first tries the size it last reserved (its
                # coordinator sees the dead node for up to 20 s) and gives a group that cannot
                # be placed this long (default 60 s) before it tries the size that fits.
                "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "15",
            }),
            "--",
            sys.executable, str(REPO / "jobs" / "train_informin.py"),
            "--config", str(REPO / "jobs" / "configs" / "informin_tiny.yaml"),
            *overrides,
            "--output", str(output),
        ]  # fmt: skip
        timeline.add("job submitted")
        submitted = subprocess.run(
            command, cwd=REPO, env=cluster.client_env(), capture_output=True, text=True,
            timeout=900,
        )  # fmt: skip
        logs = submitted.stdout + submitted.stderr
        timeline.add(f"job ended (ray job submit exit {submitted.returncode})")
        groups.stop()
        status = requests.get(
            f"{cluster.dashboard_url}/api/jobs/{submission_id}",
            headers=cluster.auth_headers(),
            timeout=30,
        ).json()
        train_workers = cluster.state("actors", class_name="RayTrainWorker")
        head = [node["node_id"] for node in cluster.state("nodes") if node["is_head_node"]]
        try:  # down to the autoscaler's minimum of 1
            wait_for(lambda: len(cluster.alive_worker_nodes()) <= 1, 240, "idle nodes to go")
            scaled_down = True
        except TimeoutError:
            scaled_down = False
        timeline.add("scaled down to 1 node" if scaled_down else "nodes still up at deadline")
        nodes.stop()
    print(f"elastic timeline:\n{timeline}")

    assert submitted.returncode == 0, logs[-6000:]
    assert status["status"] == "SUCCEEDED", (status, logs[-6000:])
    placed = groups.placed_sizes()
    assert placed and placed[0] == 1, f"the run was not placed on one worker:\n{timeline}"
    sizes = [groups.groups[a] for a in sorted(groups.groups)]  # sizes of the groups that trained
    assert 2 in sizes, f"the group never grew to 2 workers:\n{timeline}"
    assert groups.killed, f"no node was killed:\n{timeline}"
    after_kill = sizes[sizes.index(2) + 1 :]
    assert after_kill and after_kill[0] == 1, f"the group did not shrink:\n{timeline}"
    assert nodes.most == 2 and scaled_down, timeline
    assert not {actor["node_id"] for actor in train_workers} & set(head), "a worker on the head"

    # Every step trained one global batch of 16 rows, whatever the group's size, and the
    # surviving steps are the epoch's global batches in order: none twice, none skipped.
    records = row_log_records(output)
    assert len(resumed_from(records)) >= 2  # the grow and the shrink each resumed
    steps = kept_steps(records)
    assert list(steps) == list(range(1, STEPS + 1))
    assert all(len(rows) == GLOBAL_BATCH for rows in steps.values())
    expected = expected_batches(corpus, tiny_bert_path, overrides)
    assert [sorted(rows) for rows in steps.values()] == [sorted(b) for b in expected[:STEPS]]

    metrics = json.loads((output / "metrics.json").read_text())
    assert metrics["steps"] == STEPS and metrics["global_batch"] == GLOBAL_BATCH
    assert metrics["restarts"] >= 2
    keys = s3.keys(bucket.removeprefix("s3://"), f"runs/{run_name}/")
    checkpoints = {key.split("/")[2] for key in keys if key.split("/")[2].startswith("checkpoint_")}
    assert checkpoints, f"no checkpoint on the storage path: {keys}"
    assert f"runs/{run_name}/model/config.json" in keys, keys
    assert metrics["model_uri"] == f"{bucket}/runs/{run_name}/model"
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


def expected_batches(corpus: Path, model_path: str, overrides: list[str]) -> list[list[int]]:
    """The epoch's global batches for the job's config, read in this process."""
    from harness.epoch_reference import reference_batches
    from harness.tiny_run import TINY_YAML

    from distributed_emb.config import TrainingConfig, load_config

    config = load_config(TrainingConfig, str(TINY_YAML), overrides)
    return reference_batches(config)
