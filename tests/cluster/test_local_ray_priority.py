"""A local run's Ray workers run at the driver's priority, not at Ray's default nice 15 (which
leaves training only the CPU that anything else on the machine does not want), and see Ray
Train's preemption watcher turned off (runtime.LOCAL_INSTANCE_ENVIRONMENT)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.ray]

REPO = Path(__file__).resolve().parents[2]

# runtime.start_ray as the jobs call it, then the niceness of the driver and of a task's worker.
PROBE = """
import json, os
import ray
from distributed_emb.runtime import start_ray
from distributed_emb.config import TrainingConfig, load_config

settings = load_config(TrainingConfig, None, ["ray.num_cpus=1", "ray.object_store_memory_mb=100"])
start_ray(settings.ray)

@ray.remote
def worker_settings():
    # Where Ray Train's placement-group cleaner, a worker, asks whether its controller lives.
    from ray.dashboard.utils import get_address_for_submission_client

    state_api = get_address_for_submission_client(None)
    return os.nice(0), os.environ.get("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"), state_api

nice, watcher, state_api = ray.get(worker_settings.remote())
print(json.dumps({"driver": os.nice(0), "worker": nice, "watcher": watcher,
                  "env_left": os.environ.get("RAY_worker_niceness"),
                  "state_api": state_api}), flush=True)
ray.shutdown()
"""


def _start_probe(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", PROBE],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _seen(probe: subprocess.Popen) -> dict:
    stdout, stderr = probe.communicate(timeout=300)
    assert probe.returncode == 0, stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


def test_local_workers_run_at_the_drivers_priority_unless_the_user_says_otherwise(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_worker_niceness")}
    env.pop("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", None)
    # Two local instances side by side (each its own ports and session; a Ray start is mostly
    # waiting, so the two overlap), each with its own HOME: the token file start_ray writes
    # stays in the test's directory and is not shared between the two.
    (tmp_path / "default").mkdir()
    (tmp_path / "user").mkdir()
    by_default = _start_probe({**env, "HOME": str(tmp_path / "default")})
    user_set = _start_probe(
        {**env, "HOME": str(tmp_path / "user"), "RAY_worker_niceness": "7",
         "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "1"}
    )  # fmt: skip
    seen = _seen(by_default)
    assert seen["worker"] == seen["driver"]
    assert seen["watcher"] == "0"  # Ray Train's controller, a worker too, reads it there
    assert seen["env_left"] is None  # the setting is not left behind in the driver's env

    seen_user_set = _seen(user_set)
    assert seen_user_set["worker"] == 7 and seen_user_set["watcher"] == "1"

    # Neither instance has a dashboard, yet each names a State API address; were it the same
    # (Ray's default port), a dashboard another instance held there would answer one run's
    # cleaner "no such actor" and it would remove that run's live workers.
    assert seen["state_api"] != seen_user_set["state_api"]
