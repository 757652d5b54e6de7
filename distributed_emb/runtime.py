"""The process and Ray runtime every job runs in: environment defaults (set at import), logging,
and joining a Ray cluster or starting a local one. No argument parsing (cli.py) and no training."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from distributed_emb.console import LOG_FORMAT, dedupe_repeated_ray_warnings, quiet_ray_data
from distributed_emb.progress_report import MODE_VARIABLE as PROGRESS_MODE

if TYPE_CHECKING:
    from distributed_emb.ray_config import RayConfig

log = logging.getLogger("distributed_emb")

WORKER_SETUP_HOOK = "distributed_emb.console.quiet_worker_setup"


# Set in this process and passed to every Ray worker (start_ray) unless the user set them.
# The hub is left as the environment says (online unless HF_HUB_OFFLINE=1): a cluster with
# internet loads `model.path=BAAI/bge-small-en-v1.5` as sentence-transformers would. Switching
# it off is for machines without internet, and the test harness does it for itself.
# - TOKENIZERS_PARALLELISM: one thread per tokenising process, which Ray already runs many of;
# - HF_HUB_DISABLE_PROGRESS_BARS: no "Loading weights" bar each time a Train worker, Tune
#   trial or annotation actor loads the model (transformers reads it at import);
# - RAY_DATA_PARQUET_FOOTER_NUM_ACTORS: Ray Data (2.60) lists the files of every read_parquet
#   (the token cache, data/token_cache.py) through a pool of footer-reading actors, 32 new
#   worker processes per read however few the files. A search's one-file token cache took 97 s
#   to list on a 2-core cluster while they started, against 3 s with 2; two actors, each with
#   Ray's 128 concurrent reads, still list thousands of object-store files in parallel.
ENVIRONMENT_DEFAULTS = {
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "RAY_DATA_PARQUET_FOOTER_NUM_ACTORS": "2",
}


# Passed on to every Ray worker as the driver has them: where the hub cache is, and whether the
# hub is off (a driver started offline has workers offline too).
HUB_SWITCHES = ("HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")


def environment_defaults() -> None:
    for name, value in ENVIRONMENT_DEFAULTS.items():
        os.environ.setdefault(name, value)


# At import, not in a job's main(): transformers reads HF_HUB_DISABLE_PROGRESS_BARS once, when
# first imported, and a job's own imports (transformers, through the trainer) import it before
# main() runs; set later, the variable is there and the bars still show. Every job imports this
# module before any of those, and this module's imports never reach them (tests/test_offline.py
# checks both).
environment_defaults()


def setup_logging(output_dir: str | None) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if output_dir:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(Path(output_dir) / "run.log"))
    logging.basicConfig(
        level=logging.INFO,
        format=LOG_FORMAT,
        handlers=handlers,
        force=True,
    )
    dedupe_repeated_ray_warnings()


def start_ray(settings: RayConfig, state_api: bool = False) -> None:
    """Join the cluster in RAY_ADDRESS / ray.address (e.g. under `ray job submit`), or start a
    local Ray with no cluster at all.

    `state_api`: a local instance also serves Ray's State API to its own workers (the
    dashboard; every local instance's workers have its address, start_local_ray). Ray Train
    frees the placement group of a run whose controller was killed (a Tune trial stopped
    early) through it.
    """
    import ray  # startup

    # Before any dataset is built: the Data context travels with the dataset to its executor.
    quiet_ray_data()
    if ray.is_initialized():
        return
    address = settings.address or os.environ.get("RAY_ADDRESS")
    # Under `ray job submit` the job's runtime env (e.g. cluster/runtime_env.yaml) already
    # reaches every task, and Ray refuses to merge a driver runtime env that sets one of its
    # env vars again: pass on only the ones the job does not set.
    job_config = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}"))
    job_env_vars = (job_config.get("runtime_env") or {}).get("env_vars") or {}
    runtime_env = {
        "env_vars": {
            k: os.environ[k]
            for k in (*ENVIRONMENT_DEFAULTS, *HUB_SWITCHES, PROGRESS_MODE)
            if k in os.environ and k not in job_env_vars
        }
    }
    if "worker_process_setup_hook" not in (job_config.get("runtime_env") or {}):
        # Every worker process (Train workers, Ray Data executors, Ray Train's placement-group
        # cleaner) turns Data progress bars off and says a repeated Ray warning once.
        runtime_env["worker_process_setup_hook"] = WORKER_SETUP_HOOK
    if address:
        if address != "auto" and "://" not in address and "RAY_ADDRESS" not in job_env_vars:
            # Ray Train's placement-group cleaner asks the State API whether the run's
            # controller lives; without RAY_ADDRESS a worker guesses the cluster from the
            # machine's latest local Ray, and where the machine runs another Ray instance it
            # asks that one, is told "no such actor", and removes the live run's workers.
            runtime_env["env_vars"]["RAY_ADDRESS"] = address
        ray.init(address=address, runtime_env=runtime_env)
        return
    # The machine's own cores: the resource plan (resource_plan.py, run by run_training) leaves
    # Ray Data its share by lowering the Train workers' reservation where it must, so nothing
    # depends on logical CPUs above the core count (docs/ARCHITECTURE.md, "Ray on small machines").
    store = settings.object_store_memory_mb
    # Ray's GCS, raylet and worker gRPC ports listen on every interface whatever the node IP:
    # token auth is what refuses strangers, so it is set here, not left to Ray's default.
    require_local_token_auth()
    start_local_ray(
        num_cpus=settings.num_cpus or os.cpu_count() or 1,
        include_dashboard=state_api,
        object_store_memory=store * 1024**2 if store else None,
        runtime_env=runtime_env,
    )


def start_local_ray(runtime_env: dict | None = None, **init_kwargs) -> None:
    """A new local Ray instance of this process's own, whose workers know its address.

    Never a `ray start` cluster that happens to run on the machine (that one is joined only
    through RAY_ADDRESS / ray.address): `address="local"`. And the instance's GCS address in
    every worker's RAY_ADDRESS: Ray Train's placement-group cleaner asks the State API whether
    its run's controller lives, and a worker without the address guesses the machine's most
    recent Ray; where the machine runs another instance with a dashboard (a second local job,
    a Tune search, a `ray start` head) it asks that one, is told "no such actor" and removes
    the live run's workers. With the address it asks its own instance, which answers or (with
    no dashboard) cannot, and the cleaner keeps waiting. `ray.init` keyword arguments pass on.

    An instance without a dashboard still registers a State API address, the default port
    8265 where nothing of its own listens; when another instance's dashboard holds 8265, the
    workers would ask that one after all. So such an instance registers a free port of its
    own instead: the State API it names is its own, absent, never another instance's.
    """
    import ray

    if init_kwargs.get("include_dashboard") is False:
        init_kwargs.setdefault("dashboard_port", _free_port())
    runtime_env = dict(runtime_env or {})
    env_vars = dict(runtime_env.get("env_vars") or {})
    port = _free_port()
    os.environ["RAY_GCS_SERVER_PORT"] = str(port)  # read by the local head at start
    env_vars.setdefault("RAY_ADDRESS", f"{ray.util.get_node_ip_address()}:{port}")
    runtime_env["env_vars"] = env_vars
    try:
        with local_instance_environment():
            ray.init(address="local", runtime_env=runtime_env, **init_kwargs)
    finally:
        os.environ.pop("RAY_GCS_SERVER_PORT", None)


# Read by a local raylet when it starts, and inherited by every worker it spawns; an explicit
# value in the environment still wins, and `ray start` clusters keep Ray's own defaults.
# - RAY_worker_niceness: Ray starts its workers at nice 15, so on a machine doing anything else
#   a local run gets only the CPU left over, while the plain script a user compares it with
#   runs at 0. A local run is the user's foreground job: its workers run at the driver's.
# - RAY_TRAIN_ENABLE_PREEMPTION_WATCHER: Ray Train starts an actor per run that polls for spot
#   node preemption; one machine has no node to lose to a preemption, and the actor's start
#   costs each run seconds of a small machine's CPU.
LOCAL_INSTANCE_ENVIRONMENT = {
    "RAY_worker_niceness": "0",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
}


@contextlib.contextmanager
def local_instance_environment() -> Iterator[None]:
    """LOCAL_INSTANCE_ENVIRONMENT's variables that are unset, set while a local Ray starts."""
    added = [name for name in LOCAL_INSTANCE_ENVIRONMENT if name not in os.environ]
    for name in added:
        os.environ[name] = LOCAL_INSTANCE_ENVIRONMENT[name]
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def require_local_token_auth() -> None:
    """RAY_AUTH_MODE=token for a local Ray started by this process (unless the user set the
    variable), with a token only its owner can read.

    Ray 2.60 enables token auth for a new local ray.init by default and writes a missing
    ~/.ray/auth_token with the process umask (often world-readable); both are Ray's choices
    that may change, so the mode is set explicitly and the token file created 0600.
    """
    if "RAY_AUTH_MODE" not in os.environ:
        from ray._raylet import Config  # private

        os.environ["RAY_AUTH_MODE"] = "token"
        # Ray caches its config (the auth mode included) when imported: without a refresh this
        # driver would not send the token its own GCS then demands. Ray's own default-on path
        # (authentication_token_setup._enable_token_auth) makes the same call.
        Config.initialize("")
    mode = os.environ["RAY_AUTH_MODE"]
    if mode != "token":
        log.warning(
            "RAY_AUTH_MODE=%s: this local Ray accepts clients without a token on ports that "
            "listen on every interface (see docs/OPERATIONS.md, security model)",
            mode,
        )
        return
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return  # the user's own token
    token_file = Path.home() / ".ray" / "auth_token"
    if not token_file.exists():
        token_file.parent.mkdir(parents=True, exist_ok=True)
        try:
            descriptor = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return  # another local job of this user made it a moment ago, 0600 as here
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secrets.token_hex(32))  # what `ray get-auth-token --generate` makes
    elif token_file.stat().st_mode & 0o077:
        log.warning("%s was readable by other users; made it private (0600)", token_file)
        token_file.chmod(0o600)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]
