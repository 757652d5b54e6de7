"""No silent stall: a driver-side watchdog around `trainer.fit()`.

A run that can never be scheduled shows the same picture every time: some task, actor or
placement group of the job sits waiting for resources that never free (Ray Data read tasks
behind Train workers that hold every CPU; a worker group waiting for nodes that never come),
and Ray waits forever. Every `poll_s` the watchdog asks Ray what is waiting:
- tasks in PENDING_NODE_ASSIGNMENT and actors in PENDING_CREATION of this job (Ray's state
  API; needs the dashboard, which `ray start` and `ray job submit` clusters have; a local
  Ray started without one is not asked);
- placement groups in PENDING (Ray Train's worker group; from the GCS, always available);
and remembers since when each has waited. When one has waited `train.stall_timeout_s`, the
watchdog logs what waits, for which resources, and what the cluster has free, then aborts the
run: it interrupts the driver's main thread (Ray Train's own Ctrl-C path, which stops the
controller and frees the workers), and `run_training` raises `StallError` with that message.
A slow but healthy run never trips it: its tasks wait seconds, not minutes, and a new task
restarts no clock. Waiting that changes identity every few seconds is progress, not a stall.
An elastic group (`train.num_workers=[min, max]`) asks for the workers beyond those that fit
through Ray Train's autoscaling request, not a placement group that waits, so a cluster that
never reaches `max` is not a stall; a group that cannot place even the workers it chose is.
"""

from __future__ import annotations

import _thread
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import ray
from ray.util.state import list_actors, list_tasks

from distributed_emb.console import RepeatFilter

log = logging.getLogger(__name__)
# What the probe cannot ask is the same for every watchdog of a process (a local Ray without
# the dashboard), and an evaluation starts one watchdog per task: said once, then counted.
PROBE_REPEATS = RepeatFilter()
probe_log = logging.getLogger(f"{__name__}.probe")
probe_log.addFilter(PROBE_REPEATS)

# After the abort, how long the driver gets to unwind before the process exits on its own.
ABORT_GRACE_S = 60.0
# What a stage with no config of its own waits (= train.stall_timeout_s's default).
DEFAULT_STALL_TIMEOUT_S = 600.0


class StallError(RuntimeError):
    """The run waited `train.stall_timeout_s` for resources; the message names them."""


@dataclass(frozen=True)
class Waiting:
    kind: str  # "task", "actor" or "placement group"
    key: str  # its id
    name: str
    resources: dict


def _fmt_resources(resources: dict) -> str:
    # Placement-group-derived names (CPU_group_0_<id>) say the same as the plain one.
    shown = {k: v for k, v in resources.items() if "_group_" not in k and v}
    return ", ".join(f"{k}: {v:g}" for k, v in sorted(shown.items())) or "nothing"


def state_api_served() -> bool:
    """Whether this Ray serves its State API (the dashboard). A local Ray started without one
    (a laptop run, runtime.start_ray) does not: asking it would only fail, every poll."""
    try:
        from ray._private.worker import get_dashboard_url

        return bool(get_dashboard_url())
    except Exception:  # not knowable here: ask, and say so if the asking fails
        return True


def pending_work(
    job_id: str | None, address: str | None, ask_state_api: bool = True
) -> tuple[list[Waiting], str | None]:
    """What waits for resources now; the second value says what could not be asked.
    `ask_state_api` False: placement groups only (a Ray without the dashboard)."""
    found: list[Waiting] = []
    problems = []
    for pg_id, info in (ray.util.placement_group_table() or {}).items():
        if info.get("state") == "PENDING":
            total: dict = {}
            for bundle in (info.get("bundles") or {}).values():
                for k, v in bundle.items():
                    total[k] = total.get(k, 0) + v
            bundles = len(info.get("bundles") or {})
            found.append(
                Waiting(
                    "placement group",
                    pg_id,
                    f"{info.get('name') or pg_id[:8]} ({bundles} bundles)",
                    total,
                )
            )
    if not ask_state_api:
        return found, None
    try:
        filters = [("state", "=", "PENDING_NODE_ASSIGNMENT")]
        if job_id:
            filters.append(("job_id", "=", job_id))
        for task in list_tasks(address=address, filters=filters, detail=True, limit=200):
            found.append(
                Waiting("task", task.task_id, task.name, dict(task.required_resources or {}))
            )
        filters = [("state", "=", "PENDING_CREATION")]
        if job_id:
            filters.append(("job_id", "=", job_id))
        for actor in list_actors(address=address, filters=filters, detail=True, limit=200):
            resources = dict(getattr(actor, "required_resources", None) or {})
            found.append(Waiting("actor", actor.actor_id, actor.class_name, resources))
    except Exception as error:  # no dashboard (a local Ray started without it), timeouts
        problems.append(f"Ray's state API did not answer ({type(error).__name__}: {error})")
    return found, "; ".join(problems) or None


class StallWatchdog:
    """`with StallWatchdog(timeout_s): trainer.fit()`; then `check()` raises StallError if it
    fired. `probe` (tests) replaces `pending_work`."""

    def __init__(
        self,
        timeout_s: float | None,
        poll_s: float | None = None,
        probe=None,
        hint: str = "",
        interrupt=_thread.interrupt_main,
    ):
        self.timeout_s = timeout_s
        self.poll_s = poll_s or max(0.5, min(10.0, (timeout_s or 0) / 6))
        self.hint = hint
        self._probe = probe
        self._interrupt = interrupt
        self._since: dict[tuple[str, str], float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: StallError | None = None

    def __enter__(self) -> StallWatchdog:
        if self.timeout_s is None:
            return self
        if self._probe is None:
            context = ray.get_runtime_context()
            job_id = context.get_job_id()
            address = getattr(context, "gcs_address", None)
            ask = state_api_served()
            if not ask:
                # Expected, not a problem: a local run's Ray has no dashboard; its stalls (a
                # worker group that never fits) show as pending placement groups.
                probe_log.info("stall watchdog: no dashboard; watching placement groups only")
            self._probe = lambda: pending_work(job_id, address, ask_state_api=ask)
        self._thread = threading.Thread(target=self._run, name="stall-watchdog", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.poll_s + 5)

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        warned_probe = False
        while not self._stop.wait(self.poll_s):
            try:
                waiting, problem = self._probe()
            except Exception as error:  # never let the watchdog itself kill a healthy run
                waiting, problem = [], f"{type(error).__name__}: {error}"
            if problem and not warned_probe:
                probe_log.warning("stall watchdog: %s; watching placement groups only", problem)
                warned_probe = True
            now = time.monotonic()
            keys = {(w.kind, w.key) for w in waiting}
            # A clock per waiting thing: what was scheduled meanwhile restarts nothing.
            self._since = {k: self._since.get(k, now) for k in keys}
            stalled = [w for w in waiting if now - self._since[(w.kind, w.key)] >= self.timeout_s]
            if stalled:
                self._fire(waiting, now)
                return

    def _fire(self, waiting: list[Waiting], now: float) -> None:
        groups: dict[tuple[str, str, str], list[float]] = {}
        for w in waiting:
            key = (w.kind, w.name, _fmt_resources(w.resources))
            groups.setdefault(key, []).append(now - self._since[(w.kind, w.key)])
        lines = [
            f"  {len(ages)} {kind}{'s' if len(ages) > 1 else ''} {name!r} waiting for "
            f"{{{resources}}} each, for {max(ages):.0f} s"
            for (kind, name, resources), ages in sorted(groups.items())
        ]
        message = (
            f"no progress: the run waited {self.timeout_s:g} s (train.stall_timeout_s) for "
            "resources that never freed:\n" + "\n".join(lines) + "\n" + _free_now()
        )
        if self.hint:
            message += "\n" + self.hint
        self.error = StallError(message)
        log.error("%s", message)
        self._interrupt()
        # If the driver does not unwind (a wait that ignores the interrupt), do not wait
        # forever either: the job fails with the message above already logged.
        if not self._stop.wait(ABORT_GRACE_S):
            log.error("the run did not stop %g s after the stall; exiting", ABORT_GRACE_S)
            logging.shutdown()
            os._exit(3)


@contextmanager
def no_silent_stall(timeout_s: float | None, hint: str = "", probe=None) -> Iterator[None]:
    """`with no_silent_stall(timeout_s, hint):` around any Ray work the driver waits on
    (trainer.fit(), an actor pool's output): waiting `timeout_s` for resources that never
    free raises StallError naming them, instead of an endless wait.

    Only on the main thread: the abort is a KeyboardInterrupt there (Ray Train's and Ray
    Data's own Ctrl-C path). Elsewhere (a Tune trial's fit runs in a thread) the block runs
    unwatched. `timeout_s` None: unwatched. `probe` (tests) replaces `pending_work`.

    The block starts with Python's own SIGINT handler and gives the previous one back at the
    end. Why: Ray Train and Ray Tune install SIGINT handlers and leave them installed after
    fit() returns; the one left by an earlier fit in the same process (an InfoCSE round,
    a training job's fit before its evaluation) swallows the interrupt (Tune's only sets a
    flag of a finished search), and the stalled wait would go on. A fit inside the block
    installs its own handler over this one, which is the Ctrl-C path the abort means."""
    if timeout_s is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous_handler = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with StallWatchdog(timeout_s, hint=hint, probe=probe) as watchdog:
            try:
                yield
            except (KeyboardInterrupt, SystemExit, Exception):
                watchdog.check()  # a stall: its message, not the abort's traceback
                raise
        watchdog.check()
    finally:
        if previous_handler is not None:  # None: installed outside Python; nothing to restore
            signal.signal(signal.SIGINT, previous_handler)


def _free_now() -> str:
    try:
        total = ray.cluster_resources()
        free = ray.available_resources()
    except Exception:  # a test probe without Ray up
        return ""
    shown = [
        f"{key} {free.get(key, 0):g} of {total[key]:g} free"
        for key in ("CPU", "GPU")
        if total.get(key)
    ]
    return "  cluster now: " + ", ".join(shown) if shown else ""
