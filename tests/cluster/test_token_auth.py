"""Ray token authentication on a real head, configured as cluster/*.yaml configure every node:
RAY_AUTH_MODE=token plus the token, dashboard on 127.0.0.1.

What a stranger who reaches the ports gets: nothing. A job submitted without the token, or
with a wrong one, is refused before Ray creates a job, and a Ray client without the token
cannot join through the GCS port (the one cluster members must be able to reach). With the
token both work.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time

import pytest
import requests
from harness.processes import descendants, still_running
from harness.ray_head import (
    RAY_CLI,
    base_env,
    free_ports,
    listening_addresses,
    local_ray_head,
)

pytestmark = [pytest.mark.ray, pytest.mark.slow]

HELLO = ["python", "-c", "print('hi')"]
REJECTED = "InvalidAuthToken"  # what the GCS answers a client without the right token


@pytest.fixture(scope="module")
def token_head():
    with local_ray_head(token=secrets.token_urlsafe(32), num_cpus=2) as head:
        yield head


def _submit(head, env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [RAY_CLI, "job", "submit", "--address", head.dashboard_url, "--", *HELLO],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _join_gcs(head, env) -> subprocess.Popen:
    """A Ray driver connecting through the GCS port (gRPC), as a cluster node or client would."""
    code = f"import ray; ray.init(address={head.gcs_address!r}); print('joined', len(ray.nodes()))"
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_dashboard_listens_on_loopback_only_and_requires_a_token(token_head):
    assert listening_addresses(token_head.dashboard_port) == {"127.0.0.1"}
    mode = requests.get(f"{token_head.dashboard_url}/api/authentication_mode", timeout=30)
    assert mode.json()["authentication_mode"] == "token"
    assert requests.get(f"{token_head.dashboard_url}/api/jobs/", timeout=30).status_code == 401


def test_without_the_token_nothing_gets_in_and_with_it_everything_works(token_head, tmp_path):
    # An empty HOME, so a token some other run left in ~/.ray/auth_token cannot be used.
    stranger_home = tmp_path / "stranger"
    stranger_home.mkdir()
    no_token = token_head.client_env(token=None, home=stranger_home)
    wrong_token = token_head.client_env(token=secrets.token_urlsafe(32), home=stranger_home)
    right_token = token_head.client_env(token=True, home=stranger_home)
    # The launcher machine as cluster/README.md sets it up: `ray get-auth-token --generate`
    # wrote ~/.ray/auth_token, and the shell has RAY_AUTH_MODE=token (without it the Ray
    # client sends no token at all).
    user_home = tmp_path / "user"
    (user_home / ".ray").mkdir(parents=True)
    (user_home / ".ray" / "auth_token").write_text(token_head.token + "\n")
    documented_user = token_head.client_env(token=None, home=user_home)
    documented_user["RAY_AUTH_MODE"] = "token"

    # A GCS client without the token retries (and may hang on a busy machine) rather than fail
    # fast: collect its output while the job API is tried, then stop it.
    gcs_without_token = _join_gcs(token_head, no_token)
    collected: list[str] = []
    reader = threading.Thread(target=lambda: collected.extend(gcs_without_token.stdout))
    reader.start()
    try:
        refused = _submit(token_head, no_token)
        forbidden = _submit(token_head, wrong_token)
        accepted = _submit(token_head, documented_user)
        deadline = time.monotonic() + 120
        while not any(REJECTED in line for line in collected) and time.monotonic() < deadline:
            if gcs_without_token.poll() is not None:
                break
            time.sleep(1)
    finally:
        gcs_without_token.kill()
        reader.join(timeout=30)
    gcs_output = "".join(collected)
    gcs_with_token = _join_gcs(token_head, right_token)
    joined_output, _ = gcs_with_token.communicate(timeout=240)

    assert refused.returncode != 0
    assert "Unauthorized: Missing authentication token" in refused.stdout + refused.stderr
    assert forbidden.returncode != 0
    assert "Forbidden: Invalid authentication token" in forbidden.stdout + forbidden.stderr
    assert accepted.returncode == 0, accepted.stdout[-3000:] + accepted.stderr[-3000:]
    assert "hi" in accepted.stdout.splitlines()

    # The refused submissions never became jobs: the head knows exactly one, and it succeeded
    # (the other entries are drivers, e.g. the GCS client that joined with the token).
    jobs = requests.get(
        f"{token_head.dashboard_url}/api/jobs/", headers=token_head.auth_headers(), timeout=30
    ).json()
    submitted = [job for job in jobs if job["type"] == "SUBMISSION"]
    assert [(job["entrypoint"], job["status"]) for job in submitted] == [
        (shlex.join(HELLO), "SUCCEEDED")
    ]

    assert REJECTED in gcs_output, gcs_output[-2000:]
    assert "joined" not in gcs_output
    assert gcs_with_token.returncode == 0, joined_output[-2000:]
    assert "joined 1" in joined_output


# --- a local run: runtime.start_ray as jobs/train_informin.py calls it ----------------------------

# Runs runtime.start_ray (with the State API, so the dashboard/job HTTP server starts too) in a
# fresh HOME and umask 022, prints what it opened, and keeps Ray up until stdin closes.
LOCAL_START = """
import json, os, sys
import psutil, ray
from distributed_emb.runtime import start_ray
from distributed_emb.config import TrainingConfig, load_config

os.umask(0o022)
real_init = ray.init
ray.init = lambda **kwargs: real_init(dashboard_port=int(sys.argv[1]), **kwargs)
start_ray(
    load_config(TrainingConfig, None, ["ray.num_cpus=1", "ray.object_store_memory_mb=100"]).ray,
    state_api=True,
)
ours = {p.pid: p.name() for p in psutil.Process().children(recursive=True)}
ours[os.getpid()] = "driver"
token_file = os.path.expanduser("~/.ray/auth_token")
print(json.dumps({
    "auth_mode": os.environ.get("RAY_AUTH_MODE"),
    "token_file_mode": os.stat(token_file).st_mode & 0o777,
    "token": open(token_file).read().strip(),
    "gcs_address": ray.get_runtime_context().gcs_address,
    "listening": [
        [c.laddr.ip, c.laddr.port, ours[c.pid]]
        for c in psutil.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.pid in ours
    ],
}), flush=True)
sys.stdin.read()
ray.shutdown()
"""


def _wait_for_rejection(process: subprocess.Popen, timeout_s: float = 120) -> str:
    """Output of a GCS client without the token until Ray reports the rejection (it retries
    rather than exit), then stop it."""
    collected: list[str] = []
    reader = threading.Thread(target=lambda: collected.extend(process.stdout))
    reader.start()
    deadline = time.monotonic() + timeout_s
    try:
        while not any(REJECTED in line for line in collected) and time.monotonic() < deadline:
            if process.poll() is not None:
                break
            time.sleep(1)
    finally:
        process.kill()
        reader.join(timeout=30)
    return "".join(collected)


def test_a_local_run_demands_the_token_and_keeps_http_on_loopback(tmp_path):
    home, stranger_home = tmp_path / "home", tmp_path / "stranger"
    home.mkdir()
    stranger_home.mkdir()
    env = {**base_env(), "HOME": str(home)}
    (dashboard_port,) = free_ports(1)
    local = subprocess.Popen(
        [sys.executable, "-c", LOCAL_START, str(dashboard_port)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        opened = json.loads(local.stdout.readline() or "{}")
        assert opened, "runtime.start_ray did not start a local Ray"
        stranger = {**base_env(), "HOME": str(stranger_home)}
        job_api = f"http://127.0.0.1:{dashboard_port}/api/jobs/"
        anonymous_jobs = requests.get(job_api, timeout=30)
        token_jobs = requests.get(
            job_api, headers={"Authorization": f"Bearer {opened['token']}"}, timeout=30
        )
        gcs_output = _wait_for_rejection(
            _join_gcs(type("Head", (), {"gcs_address": opened["gcs_address"]}), stranger)
        )
    finally:
        tree = descendants(local.pid)
        local.communicate(input="", timeout=120)
        for pid in still_running(tree):
            os.kill(pid, signal.SIGKILL)

    # Token auth because our start asked for it (not Ray's default), and a token file only
    # its owner can read (Ray itself writes it with the umask: 0644 here).
    assert opened["auth_mode"] == "token"
    assert opened["token_file_mode"] == 0o600, oct(opened["token_file_mode"])
    # The dashboard / job HTTP API: loopback only, and the token even there.
    dashboard = {ip for ip, port, _ in opened["listening"] if port == dashboard_port}
    assert dashboard == {"127.0.0.1"}, opened["listening"]
    assert anonymous_jobs.status_code == 401
    assert token_jobs.status_code == 200
    # The GCS port listens on every interface (Ray 2.60): a client without the token is refused.
    gcs_port = int(opened["gcs_address"].rsplit(":", 1)[1])
    assert {ip for ip, port, _ in opened["listening"] if port == gcs_port} & {"::", "0.0.0.0"}
    assert REJECTED in gcs_output, gcs_output[-2000:]
    assert "joined" not in gcs_output
