"""One local Ray for the whole test session, and the check that a test gave back what it took.

Starting and stopping a local Ray costs seconds, and a torch import in each fresh worker
process costs more; a module-scoped instance paid that in every module that trains. The
session's instance is started the first time a test asks for `ray_local` and shut down before
the first test of a module that does not use it (such a module may start its own Ray, a `ray
start` head or a multi-node cluster). `order_shared_ray_modules` runs every module that uses
the shared instance one after another, so it starts once.

After each test that used the shared instance, `assert_resources_released` waits until every
CPU is free again and otherwise fails naming the actors and placement groups still alive: a
leak then fails the test that caused it instead of stalling a later one on "waiting for
resources".
"""

from __future__ import annotations

import os
import time

SHARED_RAY_FIXTURE = "ray_local"
RELEASE_TIMEOUT_S = 60.0  # Ray Train tears a finished run's worker group down asynchronously


_shared_address: str | None = None  # the GCS of the instance start_shared_ray started


def start_shared_ray():
    """The local instance the shared tests run on: as many logical CPUs as the machine has
    cores (nothing may depend on more), started as runtime.start_ray starts a local run's."""
    global _shared_address
    import ray

    from distributed_emb.runtime import start_local_ray

    if not ray.is_initialized():
        # As a job's own local instance: workers at the driver's priority, no preemption
        # watcher, the instance's address in every worker (the suite runs two at a time).
        start_local_ray(
            num_cpus=os.cpu_count(),
            include_dashboard=False,
            object_store_memory=512 * 1024**2,
            log_to_driver=True,
        )
        _shared_address = ray.get_runtime_context().gcs_address
    return ray


def stop_shared_ray() -> None:
    """Shut the shared instance down if it runs; a Ray that a module connected to itself (its
    own cluster, a job's instance) is left alone."""
    global _shared_address
    import ray

    if (
        _shared_address is not None
        and ray.is_initialized()
        and ray.get_runtime_context().gcs_address == _shared_address
    ):
        ray.shutdown()
    _shared_address = None


def _held_by_whom() -> str:
    """The actors and placement groups alive right now, one per line."""
    import ray
    from ray._private import state  # private: the GCS tables, no dashboard needed
    from ray.util import placement_group_table

    lines = []
    for actor in state.actors().values():
        if actor.get("State") != "DEAD":
            name = actor.get("Name") or actor.get("ActorID", "")[:12]
            lines.append(f"actor {actor.get('ActorClassName')} ({name}): {actor.get('State')}")
    for group_id, group in placement_group_table().items():
        if group.get("state") != "REMOVED":
            bundles = list(group.get("bundles", {}).values())
            lines.append(f"placement group {group_id[:12]} {group.get('state')}: {bundles}")
    free = ray.available_resources().get("CPU", 0.0)
    total = ray.cluster_resources().get("CPU", 0.0)
    lines.insert(0, f"{free:g} of {total:g} CPUs free")
    return "\n  ".join(lines)


def assert_resources_released(test_name: str, timeout_s: float = RELEASE_TIMEOUT_S) -> None:
    """Every CPU of the shared instance is free again within `timeout_s`, or an AssertionError
    that names what holds them."""
    import ray

    if not ray.is_initialized():
        return
    deadline = time.monotonic() + timeout_s
    while True:
        total = ray.cluster_resources().get("CPU", 0.0)
        if ray.available_resources().get("CPU", 0.0) >= total:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{test_name} left the shared Ray instance with CPUs held "
                f"{timeout_s:g} s after it ended:\n  {_held_by_whom()}"
            )
        time.sleep(0.2)


def shared_ray_modules(items: list) -> set:
    """The modules with a test that uses the shared instance."""
    return {item.module for item in items if SHARED_RAY_FIXTURE in item.fixturenames}


def order_shared_ray_modules(items: list, shared: set) -> list:
    """The collected tests, with the modules that use the shared Ray moved (in their own order)
    after all others, so that the instance starts once. A module stays whole, so its
    module-scoped fixtures are built once."""
    return [i for i in items if i.module not in shared] + [i for i in items if i.module in shared]
