"""The files in jobs/ as tests drive them: each declares a `JOB` that `cli.run_job` runs."""

from __future__ import annotations

import functools
import importlib.util
import logging
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
    """The job end to end, as `python jobs/<name>.py ARGV` runs it; its exit status.

    The job's logging is undone afterwards: its console handler holds the test's captured
    stderr, which pytest closes, and a later log record from any thread (the loopback S3
    server's request log) would then print a "Logging error" traceback into another test's
    stderr."""
    from distributed_emb.cli import run_job

    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    try:
        return run_job(job_module(name).JOB, argv)
    finally:
        # The job's own handlers go (pytest adds its capture handlers again for each test).
        for handler in [h for h in root.handlers if h not in before]:
            root.removeHandler(handler)
            handler.close()
        root.setLevel(level)


def checked_config(name: str, argv: list[str]) -> Any:
    """The config the job would run with, after its checks (which may raise ConfigError)."""
    from distributed_emb.cli import job_config

    job = job_module(name).JOB
    config = job_config(job, argv)
    job.check(config)
    return config
