"""A throwaway `ray start --head` on loopback, for tests that need a real head (job submission,
token auth) rather than the in-process `ray.init()` of the `ray_local` fixture.

Other test processes share this machine, so the head is made not to touch theirs:
- every port is picked free on 127.0.0.1 (no default 6379/8265/10001/52365 collisions);
- it gets its own short `--temp-dir`, so its `ray_current_cluster` address file is not the one a
  plain `ray.init()` elsewhere would find;
- it is stopped without `ray stop` (which kills every Ray process of the machine): the
  `ray start --block` process is sent SIGTERM, which makes Ray's own node shutdown kill what
  it started, and any of its descendants still alive afterwards are killed by pid.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import requests

from harness.processes import descendants, still_running

RAY_CLI = str(Path(sys.executable).with_name("ray"))
AUTH_ENV_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


@dataclass
class LocalRayHead:
    dashboard_url: str  # http://127.0.0.1:<port>: the job API `ray job submit` talks to
    dashboard_port: int
    gcs_address: str
    temp_dir: Path
    token: str | None
    log_path: Path
    # Descendants still alive after Ray's own shutdown (then killed): "pid command line".
    leftovers: list[str] = field(default_factory=list)

    def client_env(self, token: str | None | bool = True, home: Path | None = None) -> dict:
        """Environment for a Ray CLI client of this head.

        token=True: this head's token; a string: that token (e.g. a wrong one); None/False:
        no token and RAY_AUTH_MODE unset. `home` replaces HOME so that a token another test
        left in ~/.ray/auth_token cannot be picked up by accident.
        """
        env = base_env()
        if home is not None:
            env["HOME"] = str(home)
        chosen = self.token if token is True else (token or None)
        if chosen:
            env["RAY_AUTH_MODE"] = "token"
            env["RAY_AUTH_TOKEN"] = chosen
        return env

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def base_env() -> dict[str, str]:
    """os.environ without anything that would point a Ray process at another cluster."""
    env = {k: v for k, v in os.environ.items() if k not in (*AUTH_ENV_VARS, "RAY_ADDRESS")}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # A SIGTERM'd node otherwise marks itself draining and waits up to 30 s for its work to
    # move elsewhere; a test head has nowhere to move it to.
    env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"
    return env


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Distinct ports free on `host` right now ("" for every interface; sockets held until all
    are chosen)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class HeadPorts:
    """Every port a `ray start --head` opens, each picked free: no default port (6379, 8265,
    10001, 52365...) that another Ray on the machine may hold."""

    gcs: int
    dashboard: int
    client: int
    agent_http: int
    agent_grpc: int
    runtime_env: int
    metrics: int
    node_manager: int
    object_manager: int

    @classmethod
    def free(cls, host: str = "127.0.0.1") -> HeadPorts:
        return cls(*free_ports(9, host=host))


def head_command(
    ports: HeadPorts, node_ip: str, temp_dir, object_store_bytes: int, *more: str
) -> list[str]:
    """`ray start --head` on `ports`, its own temp dir, the dashboard on 127.0.0.1, plus `more`."""
    return [
        RAY_CLI,
        "start",
        "--head",
        f"--node-ip-address={node_ip}",
        f"--port={ports.gcs}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={ports.dashboard}",
        f"--ray-client-server-port={ports.client}",
        f"--dashboard-agent-listen-port={ports.agent_http}",
        f"--dashboard-agent-grpc-port={ports.agent_grpc}",
        f"--runtime-env-agent-port={ports.runtime_env}",
        f"--metrics-export-port={ports.metrics}",
        f"--node-manager-port={ports.node_manager}",
        f"--object-manager-port={ports.object_manager}",
        f"--object-store-memory={object_store_bytes}",
        f"--temp-dir={temp_dir}",
        "--include-dashboard=true",
        "--disable-usage-stats",
        *more,
    ]


def _wait_until_ready(head: LocalRayHead, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"`ray start --head` exited with {process.returncode}:\n{head.log_tail()}"
            )
        try:
            # The job API answering is what `ray job submit` needs; with token auth it must be
            # asked with the token (the health endpoints are public and prove less).
            reply = requests.get(
                f"{head.dashboard_url}/api/jobs/", headers=head.auth_headers(), timeout=5
            )
            if reply.status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(1)
    raise TimeoutError(f"Ray head not ready after {timeout_s:.0f} s:\n{head.log_tail()}")


def _stop(process: subprocess.Popen, head: LocalRayHead) -> None:
    tree = descendants(process.pid)
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    # Ray's shutdown kills its own processes; give them a moment, then kill what is left of
    # this head's tree (workers, job drivers in their own sessions) by pid.
    deadline = time.monotonic() + 20
    while still_running(tree) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid, (_, command) in still_running(tree).items():
        head.leftovers.append(f"{pid} {command}")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def local_ray_head(
    token: str | None = None,
    num_cpus: int = 2,
    object_store_mb: int = 512,
    startup_timeout_s: float = 180,
) -> Iterator[LocalRayHead]:
    """Start a head on 127.0.0.1 (token auth when `token` is given), yield it, always stop it."""
    # Short path: Ray's unix sockets live under the temp dir and sun_path holds 107 bytes.
    temp_dir = Path(tempfile.mkdtemp(prefix="rayh-", dir="/tmp"))
    ports = HeadPorts.free()
    head = LocalRayHead(
        dashboard_url=f"http://127.0.0.1:{ports.dashboard}",
        dashboard_port=ports.dashboard,
        gcs_address=f"127.0.0.1:{ports.gcs}",
        temp_dir=temp_dir,
        token=token,
        log_path=temp_dir / "ray_start.log",
    )
    env = base_env()
    env["RAY_AUTH_MODE"] = "token" if token else "disabled"
    if token:
        env["RAY_AUTH_TOKEN"] = token
    command = head_command(
        ports,
        "127.0.0.1",
        temp_dir,
        object_store_mb * 1024 * 1024,
        "--block",
        f"--num-cpus={num_cpus}",
    )
    with open(head.log_path, "w") as log:
        process = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    try:
        _wait_until_ready(head, process, startup_timeout_s)
        yield head
    finally:
        _stop(process, head)
        shutil.rmtree(temp_dir, ignore_errors=True)


def listening_addresses(port: int) -> set[str]:
    """Local IPv4/IPv6 addresses with a TCP socket listening on `port` (from /proc/net)."""
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, state = fields[1], fields[3]
                address_hex, port_hex = local.split(":")
                if state != "0A" or int(port_hex, 16) != port:  # 0A: LISTEN
                    continue
                found.add(_decode_proc_address(address_hex, width))
    return found


def _decode_proc_address(address_hex: str, width: int) -> str:
    raw = bytes.fromhex(address_hex)
    if width == 8:  # one little-endian 32-bit word
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    # IPv6: four little-endian 32-bit words.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)
