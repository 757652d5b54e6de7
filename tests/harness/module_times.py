"""A pytest plugin that writes each module's seconds (setup, call and teardown of its tests) and
the modules that use each one-lane fixture to harness/module_seconds.json, which balances the
lanes of `pytest -n 2` (harness/lanes.py). Run it on the whole suite, serially, on an idle
machine:

    python -m pytest -p harness.module_times
"""

from __future__ import annotations

import json
import time
from collections import defaultdict

import pytest

from harness.lanes import ONE_LANE_FIXTURES, SECONDS_FILE, module_of

_seconds: dict[str, float] = defaultdict(float)
_users: dict[str, set[str]] = defaultdict(set)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    started = time.perf_counter()
    yield
    module = module_of(item.nodeid)
    _seconds[module] += time.perf_counter() - started
    for fixture in set(ONE_LANE_FIXTURES) & set(item.fixturenames):
        _users[fixture].add(module)


def pytest_sessionfinish(session, exitstatus):
    if _seconds and not hasattr(session.config, "workerinput"):  # a serial run only
        recorded = {
            "seconds": {module: round(s, 1) for module, s in sorted(_seconds.items())},
            "fixtures": {fixture: sorted(users) for fixture, users in sorted(_users.items())},
        }
        SECONDS_FILE.write_text(json.dumps(recorded, indent=1) + "\n")
