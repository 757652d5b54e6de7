"""The files in jobs/ as tests drive them: each declares a `JOB` that `cli.run_job` runs."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]


@functools.cache
def job_module(name: str) -> ModuleType:
    """jobs/<name>.py, imported once (the files are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"jobs_{name}", REPO / "jobs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(name: str, argv: list[str]) -> int:
    """The job end to end, as `python jobs/<name>.py ARGV` runs it; its exit status."""
    from distributed_emb.cli import run_job

    return run_job(job_module(name).JOB, argv)


def checked_config(name: str, argv: list[str]) -> Any:
    """The config the job would run with, after its checks (which may raise ConfigError)."""
    from distributed_emb.cli import job_config

    job = job_module(name).JOB
    config = job_config(job, argv)
    job.check(config)
    return config
