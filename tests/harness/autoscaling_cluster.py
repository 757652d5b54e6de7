"""A cluster in a box: an autoscaling multi-node Ray cluster on one machine, shaped like
cluster/aws.yaml, that starts and stops only its own processes.

    cd tests
    python -m harness.autoscaling_cluster up      # prints the address, token and env to use
    python -m harness.autoscaling_cluster status  # nodes alive now (head + fake workers)
    python -m harness.autoscaling_cluster down    # stops exactly what `up` started

Shape (what cluster/aws.yaml has, scaled down):
- a head that advertises no CPU (job drivers, the Train controller and the autoscaler only);
- one worker type that scales from 0 to `max_workers` nodes, each with `worker_cpus` logical
  CPUs; Ray's fake multi-node provider starts a "node" as a real raylet (plus its agents and
  object store) on this machine, so a node can be added and removed like an instance;
- token auth on every process, the dashboard / job API on 127.0.0.1 only.

Why not `ray.cluster_utils.AutoscalingCluster`: its start() and shutdown() run
`ray stop --force`, which kills every Ray process of the machine (other tests, other users),
and the wheel does not ship the example.yaml it reads. This module writes the whole config
itself, gives the head its own temp dir and ports, and stops the cluster by process id:
every process whose command line names its temp dir or GCS address, plus all their
descendants (Ray retitles its agents, `ray::DashboardAgent`, so their command lines name
neither; the fake nodes are children of the autoscaler process).

Autoscaler v1 (what `ray start --autoscaling-config` runs unless RAY_enable_autoscaler_v2 is
set, as in cluster/aws.yaml's head command): v2 fills in the fake provider's defaults from the
example.yaml the wheel lacks, and its monitor exits with FileNotFoundError. v1 does not
publish the node types to the GCS (`ray._private.state.state.get_cluster_config()` is None).

Unlike cloud nodes, fake nodes share the head's session directory, `runtime_resources`
(unpacked `--working-dir` packages) included: a node that unpacks a job's working_dir again
replaces the directory the job's driver runs in, which then fails at its next os.getcwd().
Submit jobs to this cluster without `--working-dir` (every fake node imports this checkout).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import requests
import yaml

from harness.processes import process_table, still_running, with_descendants
from harness.ray_head import HeadPorts, base_env, head_command

RAY_CLI = str(Path(sys.executable).with_name("ray"))
REPO = Path(__file__).resolve().parents[2]
WORKER_TYPE = "cpu_worker"  # stands for aws.yaml's gpu_1x_* types
HEAD_TYPE = "ray.head.default"  # the name the fake provider gives its head
# Where `(cd tests && python -m harness.autoscaling_cluster up)` records what `down` must stop.
STATE_FILE = Path(tempfile.gettempdir()) / "distributed_emb_cluster.json"


@dataclass
class LocalCluster:
    dashboard_url: str  # http://127.0.0.1:<port>: what `ray job submit --address` takes
    gcs_address: str  # <node ip>:<port>: what `ray.init(address=...)` takes
    temp_dir: str
    token: str
    config_path: str
    log_path: str

    def client_env(self) -> dict[str, str]:
        """Environment for a Ray client (CLI, driver) of this cluster: its token, no other
        cluster's address."""
        env = base_env()
        env["RAY_AUTH_MODE"] = "token"
        env["RAY_AUTH_TOKEN"] = self.token
        return env

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def state(self, resource: str, **filters: str) -> list[dict]:
        """Ray's State API over HTTP (`nodes`, `actors`, ...), dead entries included."""
        params: dict[str, object] = {"limit": 1000, "detail": 1}
        if filters:
            params["filter_keys"] = list(filters)
            params["filter_predicates"] = ["="] * len(filters)
            params["filter_values"] = list(filters.values())
        reply = requests.get(
            f"{self.dashboard_url}/api/v0/{resource}",
            params=params,
            headers=self.auth_headers(),
            timeout=30,
        )
        reply.raise_for_status()
        return reply.json()["data"]["result"]["result"]

    def alive_worker_nodes(self) -> list[str]:
        """Node ids of the worker nodes alive now (the head excluded)."""
        return sorted(
            node["node_id"]
            for node in self.state("nodes")
            if node["state"] == "ALIVE" and not node["is_head_node"]
        )

    def set_max_workers(self, max_workers: int) -> None:
        """Let the autoscaler run up to `max_workers` worker nodes from its next update (the
        v1 autoscaler reads its config file again each update): capacity that arrives while a
        job runs, e.g. spot nodes that become available. Replaced whole, never half written."""
        config = yaml.safe_load(Path(self.config_path).read_text())
        config["max_workers"] = max_workers
        config["available_node_types"][WORKER_TYPE]["max_workers"] = max_workers
        staged = Path(self.config_path).with_suffix(".staged")
        staged.write_text(yaml.safe_dump(config))
        os.replace(staged, self.config_path)

    def log_tail(self, lines: int = 60) -> str:
        path = Path(self.log_path)
        text = path.read_text(errors="replace") if path.exists() else ""
        autoscaler = Path(self.temp_dir) / "session_latest" / "logs" / "monitor.log"
        if autoscaler.exists():
            text += "\n--- monitor.log ---\n" + autoscaler.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])


def autoscaling_config(
    gcs_address: str,
    worker_cpus: float,
    max_workers: int,
    idle_timeout_minutes: float,
    min_workers: int = 0,
) -> dict:
    """The whole launcher config for Ray's fake multi-node provider (the keys Ray's own
    fake_multi_node/example.yaml has; the schema check refuses a config missing any)."""
    return {
        "cluster_name": f"distributed-emb-local-{secrets.token_hex(3)}",
        "max_workers": max_workers,
        "provider": {
            "type": "fake_multinode",
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
            # Without it the fake nodes dial GCS on 6379 and never join.
            "gcs_address": gcs_address,
        },
        "available_node_types": {
            # As in aws.yaml: the head offers no training resources.
            HEAD_TYPE: {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0},
            WORKER_TYPE: {
                "resources": {"CPU": worker_cpus, "object_store_memory": 256 * 1024**2},
                "node_config": {},
                "min_workers": min_workers,
                "max_workers": max_workers,
            },
        },
        "head_node_type": HEAD_TYPE,
        "auth": {},
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": idle_timeout_minutes,
        "docker": {},
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
    }


def start_cluster(
    worker_cpus: float = 3,
    max_workers: int = 2,
    idle_timeout_minutes: float = 0.2,
    token: str | None = None,
    startup_timeout_s: float = 180,
    min_workers: int = 0,
) -> LocalCluster:
    """Start the head (its autoscaler starts worker nodes on demand, and keeps `min_workers`
    up); return once the job API answers. Stop it with `stop_cluster`, also when this
    raises."""
    import ray

    # Short path: Ray's unix sockets live under the temp dir and sun_path holds 107 bytes.
    temp_dir = tempfile.mkdtemp(prefix="rayc-", dir="/tmp")
    # Every interface: fake nodes reach the head on the machine's address, not loopback.
    ports = HeadPorts.free(host="")
    # The address fake nodes compute for themselves (they are started without a node IP):
    # the head must be on the same one, or the nodes' and the head's views disagree.
    node_ip = ray.util.get_node_ip_address()
    gcs_address = f"{node_ip}:{ports.gcs}"
    token = token or secrets.token_hex(32)
    config_path = Path(temp_dir) / "autoscaling.yaml"
    config_path.write_text(
        yaml.safe_dump(
            autoscaling_config(
                gcs_address, worker_cpus, max_workers, idle_timeout_minutes, min_workers
            )
        )
    )
    cluster = LocalCluster(
        dashboard_url=f"http://127.0.0.1:{ports.dashboard}",
        gcs_address=gcs_address,
        temp_dir=temp_dir,
        token=token,
        config_path=str(config_path),
        log_path=str(Path(temp_dir) / "ray_start.log"),
    )
    env = cluster.client_env()
    # The fake provider refuses to run without it; the autoscaler's default period is 5 s.
    env.update({"RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"})
    command = head_command(
        ports,
        node_ip,
        temp_dir,
        256 * 1024**2,
        f"--autoscaling-config={config_path}",
        "--num-cpus=0",
    )
    with open(cluster.log_path, "w") as log:
        # Not --block: `ray start` daemonises the head's processes and returns, so the
        # cluster outlives this process when started by hand (`up`), and tests and `down`
        # stop it the same way, by process id.
        started = subprocess.run(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    if started.returncode != 0:
        stop_cluster(cluster)
        raise RuntimeError(
            f"`ray start --head` exited with {started.returncode}:\n{cluster.log_tail()}"
        )
    deadline = time.monotonic() + startup_timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(requests.RequestException):
            # The job API answering with the token is what `ray job submit` needs.
            reply = requests.get(
                f"{cluster.dashboard_url}/api/jobs/", headers=cluster.auth_headers(), timeout=5
            )
            if reply.status_code == 200:
                return cluster
        time.sleep(1)
    tail = cluster.log_tail()
    stop_cluster(cluster)
    raise TimeoutError(
        f"local cluster's job API not ready after {startup_timeout_s:.0f} s:\n{tail}"
    )


# The hub off for every job a test submits: the test machines have no internet, and
# cluster/runtime_env.yaml leaves the hub to the user (it sets neither switch).
HUB_OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def job_runtime_env(extra_env: dict[str, str]) -> str:
    """cluster/runtime_env.yaml's switches, the hub off (HUB_OFFLINE) and `extra_env`, as JSON
    for `--runtime-env-json` (the CLI takes a file or JSON, not both), without its working_dir.

    Why no working_dir here: fake nodes share the head's session directory, so each node's
    runtime-env agent unpacks the job's package into the same path, and one of them replaced
    it (rmtree + unpack) under the running driver, whose working directory then no longer
    existed (FileNotFoundError from os.getcwd at export). Every fake node already imports this
    checkout (same machine, same venv); tests/jobs/test_job_submit.py covers `--working-dir`.
    """
    runtime_env = yaml.safe_load((REPO / "cluster" / "runtime_env.yaml").read_text())
    runtime_env.pop("working_dir", None)
    runtime_env.pop("excludes", None)
    runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **HUB_OFFLINE, **extra_env}
    return json.dumps(runtime_env)


# ---------------------------------------------------------------------------------------------
# Stopping by process id
# ---------------------------------------------------------------------------------------------


def cluster_processes(cluster: LocalCluster) -> dict[int, tuple[str, str]]:
    """pid → (start time, command line) of every process of this cluster: those naming its
    temp dir or GCS address, and all their descendants. Never this process."""
    table = process_table()
    marks = (cluster.temp_dir, cluster.gcs_address)
    named = {pid for pid, (_, _, command) in table.items() if any(m in command for m in marks)}
    found = with_descendants(named, table)
    found.pop(os.getpid(), None)
    return found


def kill_node(cluster: LocalCluster, node_id: str) -> list[int]:
    """SIGKILL every process of one fake node (its raylet, object store, workers): a lost
    spot instance. The fake provider starts a node with its id in the environment."""
    mark = f"RAY_OVERRIDE_NODE_ID_FOR_TESTING={node_id}".encode()
    killed = []
    for pid in cluster_processes(cluster):
        try:
            environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if mark in environment:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed


def stop_cluster(cluster: LocalCluster, grace_s: float = 10) -> list[str]:
    """Stop every process of the cluster by pid; return "pid command" of any that needed
    SIGKILL. Raises if some still run afterwards (naming them)."""
    killed: list[str] = []
    for _ in range(5):  # the autoscaler may start a node while we stop: collect again
        processes = cluster_processes(cluster)
        if not processes:
            break
        # The autoscaler first, so it starts no replacement for the nodes stopped below.
        for pid, (_, command) in processes.items():
            if "monitor.py" in command:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for pid in processes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while still_running(processes) and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid, (_, command) in still_running(processes).items():
            killed.append(f"{pid} {command}")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
    left = cluster_processes(cluster)
    if left:
        names = "\n".join(f"  {pid} {command}" for pid, (_, command) in left.items())
        raise RuntimeError(f"local cluster processes still running after stop:\n{names}")
    shutil.rmtree(cluster.temp_dir, ignore_errors=True)
    return killed


@contextlib.contextmanager
def local_cluster(**kwargs) -> Iterator[LocalCluster]:
    """`start_cluster(**kwargs)`, yield it, always stop it."""
    cluster = start_cluster(**kwargs)
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


def wait_for(condition, timeout_s: float, what: str, poll_s: float = 1.0):
    """Poll `condition()` until it returns something truthy; TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll_s)
    raise TimeoutError(f"gave up after {timeout_s:.0f} s waiting for {what}")


class Timeline:
    """Timestamped events of a scenario, for the test's report (printed, never asserted on
    as durations)."""

    def __init__(self) -> None:
        self.start = time.time()
        self.events: list[tuple[float, str]] = []
        self._lock = threading.Lock()

    def add(self, what: str) -> None:
        with self._lock:
            self.events.append((round(time.time() - self.start, 1), what))

    def has(self, prefix: str) -> bool:
        return any(what.startswith(prefix) for _, what in self.events)

    def __str__(self) -> str:
        return "\n".join(f"  +{t:6.1f} s  {what}" for t, what in self.events)


class NodeWatcher(threading.Thread):
    """Polls the cluster's alive worker nodes each second and records every change."""

    def __init__(self, cluster: LocalCluster, timeline: Timeline) -> None:
        super().__init__(daemon=True)
        self.cluster, self.timeline = cluster, timeline
        self.seen: set[str] = set()  # every worker node that was ever alive
        self.most = 0  # most worker nodes alive at once
        self._halt = threading.Event()

    def run(self) -> None:
        alive: set[str] = set()
        while not self._halt.is_set():
            with contextlib.suppress(requests.RequestException, KeyError):
                now = set(self.cluster.alive_worker_nodes())
                for node in sorted(now - alive):
                    self.timeline.add(f"node added {node[-5:]} ({len(now)} alive)")
                for node in sorted(alive - now):
                    self.timeline.add(f"node removed {node[-5:]} ({len(now)} alive)")
                alive = now
                self.seen |= now
                self.most = max(self.most, len(now))
            self._halt.wait(1.0)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)


# ---------------------------------------------------------------------------------------------
# By hand
# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["up", "status", "down"])
    parser.add_argument("--worker-cpus", type=float, default=3)
    parser.add_argument("--max-workers", type=int, default=2)
    parser.add_argument("--idle-timeout-minutes", type=float, default=0.5)
    args = parser.parse_args(argv)
    if args.action == "up":
        if STATE_FILE.exists():
            parser.exit(1, f"{STATE_FILE} exists: a cluster is up; run `down` first\n")
        cluster = start_cluster(args.worker_cpus, args.max_workers, args.idle_timeout_minutes)
        STATE_FILE.write_text(json.dumps(asdict(cluster)))
        STATE_FILE.chmod(0o600)  # it holds the token
        print(
            f"up: dashboard {cluster.dashboard_url}, GCS {cluster.gcs_address}\n"
            f"export RAY_AUTH_MODE=token RAY_AUTH_TOKEN={cluster.token}\n"
            f"ray job submit --address {cluster.dashboard_url} -- "
            f"python {Path.cwd() / 'jobs' / 'train_informin.py'} ...  # no --working-dir: see "
            "tests/harness/autoscaling_cluster.py"
        )
        return 0
    if not STATE_FILE.exists():
        parser.exit(1, f"no {STATE_FILE}: no cluster was brought up with `up`\n")
    cluster = LocalCluster(**json.loads(STATE_FILE.read_text()))
    if args.action == "status":
        nodes = cluster.state("nodes")
        for node in nodes:
            kind = "head" if node["is_head_node"] else "worker"
            print(f"{node['node_id'][:12]} {kind:6} {node['state']:5} {node['resources_total']}")
        return 0
    killed = stop_cluster(cluster)
    STATE_FILE.unlink()
    print(f"down: stopped; {len(killed)} process(es) needed SIGKILL")
    return 0


if __name__ == "__main__":
    sys.exit(main())
