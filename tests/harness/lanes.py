"""Lanes for `pytest -n N`: each test module goes to one of N lanes, one lane per xdist worker,
so that the lanes take about the same time.

Why lanes rather than xdist's own balancing (`--dist load`, test by test): a module's
fixtures are built once, in one worker; the session's finished tiny run (`tiny_run`) is built
once, because every module that uses it shares a lane; the shared Ray of each worker starts
once, because each lane keeps the suite's order (every module on the shared instance last);
and which modules share a worker is the same on every run, so a failure reproduces with
`-n 0` on that lane's modules.

The plan is the longest-processing-time rule on each module's seconds in a serial run
(`module_seconds.json` beside this file, written by the `harness.module_times` plugin): the
costliest bundle first, each to the lane with the least time so far. A module the file does
not know costs DEFAULT_SECONDS and bundles alone. The file only balances the lanes; a stale
one costs time, never a test.

xdist's scheduler runs in the controlling process, which sees test ids, not fixtures: so the
file also lists the modules that use each ONE_LANE_FIXTURES fixture, and the plan is made from
test ids alone (`LaneScheduling`, given to xdist by tests/conftest.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

SECONDS_FILE = Path(__file__).with_name("module_seconds.json")
DEFAULT_SECONDS = 5.0
# Session fixtures too costly to build in two workers: their modules share one lane.
ONE_LANE_FIXTURES = ("tiny_run",)


def recorded() -> dict:
    """{"seconds": {module: s}, "fixtures": {fixture: [module, ...]}}, empty without the file."""
    if not SECONDS_FILE.is_file():
        return {"seconds": {}, "fixtures": {}}
    return json.loads(SECONDS_FILE.read_text())


def module_of(nodeid: str) -> str:
    """The module's path relative to tests/: "tests/train/test_x.py::test_y[1]" ->
    "train/test_x.py"."""
    return nodeid.split("::", 1)[0].removeprefix("tests/")


def assign_lanes(modules: list[str], lanes: int, known: dict) -> dict[str, int]:
    """module -> lane (0 … lanes-1), for the modules in the suite's order."""
    bundles: dict[str, list[str]] = {}
    for module in dict.fromkeys(modules):
        shared = [f for f in ONE_LANE_FIXTURES if module in known["fixtures"].get(f, [])]
        bundles.setdefault(shared[0] if shared else module, []).append(module)

    def cost(members: list[str]) -> float:
        return sum(known["seconds"].get(module, DEFAULT_SECONDS) for module in members)

    totals = [0.0] * lanes
    lane_of: dict[str, int] = {}
    for name in sorted(bundles, key=lambda name: (-cost(bundles[name]), name)):
        lane = min(range(lanes), key=lambda index: (totals[index], index))
        totals[lane] += cost(bundles[name])
        lane_of.update(dict.fromkeys(bundles[name], lane))
    return lane_of


class LaneScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with one scope per lane: each worker is handed one whole lane,
    its tests in the order the workers collected them."""

    _lane_of: dict[str, int] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._lane_of is None:
            collected = next(iter(self.registered_collections.values()))
            modules = [module_of(test) for test in collected]
            self._lane_of = assign_lanes(modules, self.numnodes, recorded())
        return f"lane{self._lane_of[module_of(nodeid)]}"
