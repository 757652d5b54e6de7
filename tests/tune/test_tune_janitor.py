"""The placement-group janitor frees a Train worker group nobody holds any more, and only that:
not a group whose workers are alive, not a group of another shape (a trial driver's)."""

from __future__ import annotations

import os

import pytest

from distributed_emb.config import TrainingConfig
from distributed_emb.tune.driver import DRIVER_RESOURCES
from distributed_emb.tune.janitor import PlacementGroupJanitor

pytestmark = [pytest.mark.slow, pytest.mark.ray]


@pytest.fixture(scope="module")
def ray_with_state_api():
    import ray

    from distributed_emb.runtime import start_ray

    assert not ray.is_initialized()
    config = TrainingConfig()
    config.ray.num_cpus, config.ray.object_store_memory_mb = os.cpu_count(), 256
    start_ray(config.ray, state_api=True)
    yield ray
    ray.shutdown()


def test_only_an_abandoned_worker_group_is_freed_and_only_after_two_sweeps(ray_with_state_api):
    ray = ray_with_state_api
    from ray.util.placement_group import placement_group, placement_group_table
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    # Quarter-CPU workers (the shape a plan gives on a small machine): both groups and the
    # driver-shaped one fit in one core, so the test needs no logical CPUs beyond the machine's.
    worker = {"CPU": 0.25}
    abandoned = placement_group([worker, worker])  # its Train run died with its cleaner
    in_use = placement_group([worker, worker])
    driver_shaped = placement_group([{"memory": DRIVER_RESOURCES["memory"]}])
    ray.get([abandoned.ready(), in_use.ready(), driver_shaped.ready()], timeout=120)

    @ray.remote(num_cpus=0.25)
    class Worker:
        def ping(self) -> int:
            return 1

    strategy = PlacementGroupSchedulingStrategy(in_use, placement_group_bundle_index=0)
    live = Worker.options(scheduling_strategy=strategy).remote()
    assert ray.get(live.ping.remote(), timeout=120) == 1

    janitor = PlacementGroupJanitor([{"CPU": 0.25, "GPU": 0.0}])
    assert janitor.sweep() == []  # first sight: only a suspect
    assert janitor.sweep() == [abandoned.id.hex()]
    states = {
        group.id.hex(): placement_group_table(group)["state"]
        for group in (abandoned, in_use, driver_shaped)
    }
    assert states == {
        abandoned.id.hex(): "REMOVED",
        in_use.id.hex(): "CREATED",
        driver_shaped.id.hex(): "CREATED",
    }
    assert ray.get(live.ping.remote(), timeout=60) == 1
    assert janitor.sweep() == [] and janitor.removed == [abandoned.id.hex()]
