"""Progress of work that can take minutes: embedding a corpus, encoding for an evaluation,
annotating documents, preparing the token cache, mining, InfoCSE's rounds, Tune's trials.

One `Progress` per piece of work, fed the units done as they finish. Where it shows:

- **on a terminal**: a bar with the total, the rate and the ETA (tqdm);
- **elsewhere** (a `ray job logs` stream, CI, run.log, a Ray worker's log): one log line at
  most every minute, "<what>: <done>/<total> <unit> (<pct>%), <rate>/s, ETA <m:ss>", and one
  closing line for work that lasted that long;
- **nowhere** when asked: `logging.progress_bar=off` (cli.run_job), or
  `DISTRIBUTED_EMB_PROGRESS=off` in the environment (the tests set it).

The mode is one environment variable so that it reaches Ray workers (runtime.start_ray passes
it on) and code that holds no config: an encoding function knows nothing of `logging.*`.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

log = logging.getLogger(__name__)

MODE_VARIABLE = "DISTRIBUTED_EMB_PROGRESS"  # auto (default) | on | lines | off
LINE_EVERY_S = 60.0  # off a terminal: a line at most this often
POLL_EVERY_S = 5.0  # polled_progress: how often the count of work done elsewhere is read


def progress_mode(stream: TextIO | None = None) -> str:
    """ "bar", "lines" or "off": the environment's setting, "auto" judged on `stream`'s being a
    terminal (default stderr)."""
    setting = os.environ.get(MODE_VARIABLE, "auto").strip().lower()
    if setting in ("off", "lines"):
        return setting
    if setting == "on":
        return "bar"
    stream = stream if stream is not None else sys.stderr
    return "bar" if stream.isatty() else "lines"


def set_progress(setting: str) -> None:
    """`logging.progress_bar` of a job's config (auto, on, off), for this process and the Ray
    workers it starts. "auto" leaves an environment that already says otherwise alone."""
    if setting in ("on", "off"):
        os.environ[MODE_VARIABLE] = setting


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    """`with Progress("embed", total=n, unit="sentences") as progress: ... progress.update(k)`.

    `total` None: the count and rate without a percentage or ETA. `logger`: where lines go
    (default this module's, whose records reach the console and run.log). `clock`, `mode`,
    `every_s`: for tests."""

    def __init__(
        self,
        what: str,
        total: int | None,
        unit: str = "rows",
        logger: logging.Logger | None = None,
        every_s: float = LINE_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        mode: str | None = None,
    ) -> None:
        self.what, self.total, self.unit = what, total, unit
        self.logger = logger or log
        self.every_s = every_s
        self.clock = clock
        self.mode = mode or progress_mode()
        self.done = 0
        self.started = clock()
        self.last_line = self.started
        self.lines = 0
        self.bar = None
        if self.mode == "bar":
            from tqdm.auto import tqdm  # tqdm comes with transformers and Ray

            self.bar = tqdm(total=total, desc=what, unit=f" {unit}", dynamic_ncols=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def update(self, count: int = 1) -> None:
        self.done += count
        if self.bar is not None:
            self.bar.update(count)
        elif self.mode == "lines" and self.clock() - self.last_line >= self.every_s:
            self.logger.info("%s", self.line())
            self.last_line = self.clock()
            self.lines += 1

    def line(self) -> str:
        """ "<what>: <done>/<total> <unit> (<pct>%), <rate>/s, ETA <m:ss>"."""
        elapsed = max(self.clock() - self.started, 1e-9)
        rate = self.done / elapsed
        if self.total:
            left = (self.total - self.done) / rate if rate > 0 else float("inf")
            eta = _duration(left) if left != float("inf") else "?"
            return (
                f"{self.what}: {self.done:,}/{self.total:,} {self.unit} "
                f"({100 * self.done / self.total:.0f}%), {rate:,.1f}/s, ETA {eta}"
            )
        return f"{self.what}: {self.done:,} {self.unit}, {rate:,.1f}/s"

    def close(self) -> None:
        """The bar closed; off a terminal, a last line for work that already said something
        or lasted a line's interval (short work stays silent)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
            return
        elapsed = self.clock() - self.started
        if self.mode == "lines" and (self.lines or elapsed >= self.every_s):
            self.logger.info(
                "%s: %s %s in %s (%.1f/s)",
                self.what,
                f"{self.done:,}",
                self.unit,
                _duration(elapsed),
                self.done / max(elapsed, 1e-9),
            )
            self.lines += 1


@contextmanager
def polled_progress(
    what: str,
    total: int | None,
    unit: str,
    read_done: Callable[[], int],
    every_s: float = POLL_EVERY_S,
    mode: str | None = None,
    line_every_s: float = LINE_EVERY_S,
) -> Iterator[Progress | None]:
    """Progress of work this process waits on while other processes do it (a Ray Data pass
    that writes shards): `read_done()`, the units done so far (a counting actor's number), is
    read every `every_s` seconds by a daemon thread and once more at the end. Off a terminal
    only: on one, Ray Data draws its own bars for the same pass, and a second bar would tear
    them. A failing `read_done` stops the polling and nothing else: the work's own error says
    what went wrong."""
    mode = mode or progress_mode()
    if mode != "lines":
        yield None
        return
    progress = Progress(what, total, unit, mode=mode, every_s=line_every_s)
    stop = threading.Event()

    def catch_up() -> bool:
        try:
            done = int(read_done())
        except Exception:  # noqa: BLE001 - a progress line must never fail the work
            return False
        if done > progress.done:
            progress.update(done - progress.done)
        return True

    def poll() -> None:
        while not stop.wait(every_s) and catch_up():
            pass

    thread = threading.Thread(target=poll, name=f"progress: {what}", daemon=True)
    thread.start()
    try:
        yield progress
    finally:
        stop.set()
        thread.join()
        catch_up()
        progress.close()


class DoneCount:
    """Units of work done by other processes (Ray actors add to it, `polled_progress` reads
    it): a Ray actor class, started by `start_done_count`."""

    def __init__(self) -> None:
        self.done = 0

    def add(self, count: int) -> None:
        self.done += count

    def count(self) -> int:
        return self.done


def counting_actor(actor_class):
    """An `actor_class` actor that only adds numbers (no CPU reserved) on this process's node
    (the head under `ray job submit`): a 0-CPU actor may land on any worker node, and when that
    node is lost every later count fails with ActorDiedError, and the work with it
    (tests/cluster/test_node_loss.py)."""
    import ray  # startup
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # startup

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return ray.remote(num_cpus=0, scheduling_strategy=here)(actor_class).remote()


def start_done_count():
    """A `DoneCount` actor on this process's node (`counting_actor`)."""
    return counting_actor(DoneCount)
