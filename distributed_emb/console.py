"""A quiet console: Ray Data's progress bars are turned off (our own bar and step lines say
the same), and a warning that Ray repeats every few seconds is said once and then counted; the
one log line format of the driver's console, run.log and rank 0's lines."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

from distributed_emb.progress_report import progress_mode

# runtime.setup_logging's format; rank 0's run.log lines use it too, so the file reads as one.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Ray Train's detached placement-group cleaner polls the State API every few seconds and warns
# on each failed poll ("Failed to query Ray Train Controller actor state") when the local Ray
# runs without a dashboard: the same line for the whole run.
REPEATING_RAY_LOGGERS = ("ray.train.v2._internal.execution.controller.placement_group_cleaner",)


class RepeatFilter(logging.Filter):
    """Lets a message through the first time, then counts its repeats and lets one through,
    marked with the count, at the 10th, 100th, 1000th... (a stuck condition stays visible
    without filling the console). Messages are told apart by logger, level and text."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[tuple[str, int, str], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, record.getMessage())
        seen = self.counts.get(key, 0) + 1
        self.counts[key] = seen
        if seen == 1:
            return True
        if seen >= 10 and math.log10(seen).is_integer():
            record.msg = f"{key[2]} [said {seen} times so far; repeats are counted, not shown]"
            record.args = None
            return True
        return False


def dedupe_repeated_ray_warnings(loggers: Iterable[str] = REPEATING_RAY_LOGGERS) -> None:
    """Install one RepeatFilter on each of these loggers (idempotent)."""
    for name in loggers:
        target = logging.getLogger(name)
        if not any(isinstance(f, RepeatFilter) for f in target.filters):
            target.addFilter(RepeatFilter())


def quiet_ray_data() -> None:
    """Ray Data's progress in this process (and in the Ray Data executors of datasets built
    after this call: the context travels with the dataset): one bar per pass on a terminal
    (the token cache's build, annotation, the pools' reads: progress_report's "bar" mode), none
    elsewhere, where its redrawn bars would be one line each."""
    from ray.data import DataContext  # startup

    context = DataContext.get_current()
    context.enable_progress_bars = progress_mode() == "bar"
    context.enable_operator_progress_bars = False


def quiet_worker_setup() -> None:
    """Ray's `worker_process_setup_hook` (see runtime.start_ray): runs in every worker process of
    the job, including Ray Train's detached placement-group cleaner, where the repeated
    warning is logged."""
    dedupe_repeated_ray_warnings()
    quiet_ray_data()
