"""Shared command-line plumbing for the jobs: config parsing, logging, connecting to Ray."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from distributed_emb.config import ConfigError, TrainingConfig, load_config

log = logging.getLogger("distributed_emb")


def offline_defaults() -> None:
    """No hub access at run time unless the user opts in (HF_HUB_OFFLINE=0)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def setup_logging(output_dir: str | None) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if output_dir:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(Path(output_dir) / "run.log"))
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=handlers,
        force=True,
    )


def parse_training_args(
    argv: list[str] | None, default_config: Path | None, description: str
) -> TrainingConfig:
    """`[--config YAML] [--output DIR] [key=value ...]` → a validated TrainingConfig.

    Invalid configuration exits with status 2 and the key's name, before Ray starts.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--config",
        help="YAML config (default: %(default)s)",
        default=str(default_config) if default_config else None,
    )
    parser.add_argument("--output", help="output directory (sets output.dir)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. loss.temperature=0.05")
    args = parser.parse_args(argv)
    overrides = list(args.overrides)
    if args.output:
        overrides.append(f"output.dir={args.output}")
    offline_defaults()
    try:
        config = load_config(TrainingConfig, args.config, overrides)
    except ConfigError as error:
        parser.exit(2, f"config error: {error}\n")
    setup_logging(config.output.dir)
    return config


def start_ray(config: TrainingConfig, state_api: bool = False) -> None:
    """Join the cluster in RAY_ADDRESS / ray.address (e.g. under `ray job submit`), or start a
    local Ray with no cluster at all.

    `state_api`: a local instance also serves Ray's State API to its own workers (the dashboard,
    and the instance's address in every worker's RAY_ADDRESS). Ray Train frees the placement
    group of a run whose controller was killed (a Tune trial stopped early) through it; workers
    otherwise guess the address, which fails when the machine runs other Ray instances.
    """
    import ray

    if ray.is_initialized():
        return
    address = config.ray.address or os.environ.get("RAY_ADDRESS")
    # Under `ray job submit` the job's runtime env (e.g. cluster/runtime_env.yaml) already
    # reaches every task, and Ray refuses to merge a driver runtime env that sets one of its
    # env vars again: pass on only the ones the job does not set.
    job_config = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}"))
    job_env_vars = (job_config.get("runtime_env") or {}).get("env_vars") or {}
    runtime_env = {
        "env_vars": {
            k: os.environ[k]
            for k in ("HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM", "HF_HOME")
            if k in os.environ and k not in job_env_vars
        }
    }
    if address:
        ray.init(address=address, runtime_env=runtime_env)
        return
    # Logical CPUs above the core count: Ray Train workers and Ray Data read tasks otherwise
    # deadlock on small machines (see docs/ARCHITECTURE.md, "Ray on small machines").
    num_cpus = config.ray.num_cpus or 2 * (os.cpu_count() or 1)
    store = config.ray.object_store_memory_mb
    if state_api:
        port = _free_port()
        os.environ["RAY_GCS_SERVER_PORT"] = str(port)  # read by the local head at start
        runtime_env["env_vars"]["RAY_ADDRESS"] = f"{ray.util.get_node_ip_address()}:{port}"
    try:
        ray.init(
            num_cpus=num_cpus,
            include_dashboard=state_api,
            object_store_memory=store * 1024**2 if store else None,
            runtime_env=runtime_env,
        )
    finally:
        os.environ.pop("RAY_GCS_SERVER_PORT", None)


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def summarise_run(metrics: dict) -> str:
    def fmt(value, spec=".2f"):
        return "n/a" if value is None else format(value, spec)

    corpus = metrics.get("corpus") or {}
    return "\n".join(
        [
            f"model:            {metrics.get('model_dir')}",
            f"STS-B dev:        {fmt(metrics.get('stsb_dev_before'))} → "
            f"{fmt(metrics.get('stsb_dev_after'))} (best {fmt(metrics.get('stsb_dev_best'))} "
            f"at step {metrics.get('best_step')})",
            f"STS-B test:       {fmt(metrics.get('stsb_test'))} (exported model)",
            f"steps:            {metrics.get('steps')} × global batch "
            f"{metrics.get('global_batch')}",
            f"sentences/s:      {fmt(metrics.get('sentences_per_s'), '.1f')}",
            f"corpus:           kept {corpus.get('kept')}, dropped {corpus.get('dropped')}",
            f"wall time:        {fmt(metrics.get('wall_time_s'), '.0f')} s",
        ]
    )
