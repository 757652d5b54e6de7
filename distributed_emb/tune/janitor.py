"""Frees the CPUs (and GPUs) of Train runs that died without releasing them.

A Ray Train controller owns its workers' placement group. When the controller dies abruptly
(Tune stopping a trial kills it), Ray Train's PlacementGroupCleaner, a detached actor,
removes the group. When both die — seen when Ray's memory monitor killed processes on a node
short of memory — nothing removes it: the group keeps its CPUs reserved for as long as the
search's job lives, and every later trial waits for workers forever (Ray Train retries the
worker-group start without limit, for autoscaling clusters).

The janitor, a thread on the search driver, removes such groups: created by this job, shaped
like a Train worker group (every bundle one worker's resources — a trial driver's memory-only
group never is), and holding no live actor at two sweeps in a row. Live Train runs always
hold their worker actors (alive or being created) in their group, so they are never touched.
"""

from __future__ import annotations

import logging
import threading

import ray
from ray.util.placement_group import PlacementGroup, remove_placement_group
from ray.util.state import list_actors, list_placement_groups

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 30.0
LIST_LIMIT = 10_000  # the State API's largest page


class PlacementGroupJanitor:
    def __init__(
        self, worker_bundles: list[dict[str, float]], interval_s: float = SWEEP_INTERVAL_S
    ):
        # The resources of one Train worker, for every worker shape the search can produce.
        self.worker_bundles = [_plain(b) for b in worker_bundles]
        self.interval_s = interval_s
        self.removed: list[str] = []
        self._suspects: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="pg-janitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sweep()
            except Exception as error:  # the State API may be briefly unavailable
                log.warning("placement-group sweep failed (will retry): %s", error)

    def _is_worker_group(self, bundles: list[dict]) -> bool:
        shapes = [_plain(b.get("unit_resources", {})) for b in bundles or []]
        return bool(shapes) and any(all(s == w for s in shapes) for w in self.worker_bundles)

    def sweep(self) -> list[str]:
        """One pass; returns the ids of the groups removed in it."""
        context = ray.get_runtime_context()
        address, job = context.gcs_address, context.get_job_id()
        groups = list_placement_groups(
            address=address,
            filters=[("state", "=", "CREATED"), ("creator_job_id", "=", job)],
            detail=True,
            limit=LIST_LIMIT,
            raise_on_missing_output=False,
        )
        actors = list_actors(
            address=address,
            filters=[("state", "!=", "DEAD"), ("job_id", "=", job)],
            detail=True,
            limit=LIST_LIMIT,
            raise_on_missing_output=False,
        )
        if len(actors) >= LIST_LIMIT or len(groups) >= LIST_LIMIT:
            return []  # a truncated list could make a group in use look empty
        in_use = {a.placement_group_id for a in actors if a.placement_group_id}
        empty = {
            g.placement_group_id
            for g in groups
            if g.placement_group_id not in in_use and self._is_worker_group(g.bundles)
        }
        removed = []
        for group_id in sorted(empty & self._suspects):
            group = PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group_id)))
            remove_placement_group(group)
            log.warning(
                "freed placement group %s: a Train worker group with no live actor for two "
                "sweeps (its run's controller and Ray's cleaner both died)",
                group_id,
            )
            removed.append(group_id)
        self.removed += removed
        self._suspects = empty - set(removed)
        return removed


def _plain(resources: dict) -> dict[str, float]:
    """Zero entries dropped, numbers as floats: {"CPU": 1} == {"CPU": 1.0, "GPU": 0}."""
    return {k: float(v) for k, v in resources.items() if float(v) != 0.0}
