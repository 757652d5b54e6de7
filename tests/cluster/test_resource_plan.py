"""The resource plan (fit, lower, or fail naming the fix) and the stall watchdog, on the
cluster shapes users have: a head with exactly the workers' CPUs, a 0-CPU head with worker
nodes all taken by Train workers, a plan that can never fit, an autoscaling GPU cluster,
Tune's concurrent trials and InfoCSE's annotation actors."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from distributed_emb.checks import ConfigError
from distributed_emb.config import TrainingConfig, load_config
from distributed_emb.resource_plan import (
    ClusterShape,
    Extra,
    Node,
    PlanError,
    check_training_plan,
    cluster_from_ray,
    compute_plan,
    pool_plan,
    training_plan,
)
from distributed_emb.watchdog import StallError, StallWatchdog, Waiting


def _config(*overrides: str) -> TrainingConfig:
    return load_config(TrainingConfig, None, list(overrides))


def test_head_with_exactly_the_workers_cpus_lowers_their_reservation_for_ray_data():
    # 2-CPU head, 2 workers × 1 CPU: before the plan, Ray Data got 0 CPUs and waited forever.
    plan = training_plan(_config(), ClusterShape([Node(2)]))

    assert plan.fits_now and plan.problem is None
    assert plan.worker_cpu == 0.5 and plan.lowered
    assert plan.totals() == (2.0, 0.0)
    table = plan.table()
    assert "train.cpus_per_worker=1 lowered to leave Ray Data its share" in table
    assert "Ray Data (read/clean/feed)" in table and table.endswith("fits")


def test_a_cluster_with_room_keeps_the_asked_cpus():
    plan = training_plan(_config(), ClusterShape([Node(4)]))

    assert plan.fits_now and plan.worker_cpu == 1.0 and not plan.lowered


def test_zero_cpu_head_with_worker_nodes_all_taken_packs_workers_to_free_a_whole_cpu():
    # Head 0 CPU + 2 nodes × 1 CPU: each worker at 1 CPU leaves Ray Data nothing; at 0.5 both
    # fit on one node and the other keeps a whole CPU for Ray Data's tasks.
    plan = training_plan(_config(), ClusterShape([Node(0), Node(1), Node(1)]))

    assert plan.fits_now and plan.worker_cpu == 0.5


def test_zero_cpu_head_with_one_cpu_per_worker_and_lowering_off_fails_naming_the_fix():
    plan = training_plan(
        _config("train.lower_cpus_to_fit=false"), ClusterShape([Node(0), Node(1), Node(1)])
    )

    assert not plan.fits_now
    assert "2 Train workers × 1 CPU + Ray Data 1 CPU = 3 CPU" in plan.problem
    assert "this cluster has 2 CPU on 3 nodes" in plan.problem
    assert "train.num_workers=1" in plan.problem
    assert "train.cpus_per_worker=0.5 (or train.lower_cpus_to_fit=true)" in plan.problem


def test_a_plan_that_can_never_fit_names_the_numbers_and_the_smallest_fixes():
    plan = training_plan(_config("train.num_workers=8"), ClusterShape([Node(2)]))

    assert plan.problem is not None and not plan.fits_now
    assert plan.problem.startswith(
        "8 Train workers × 1 CPU + Ray Data 1 CPU = 9 CPU; this cluster has 2 CPU on 1 node"
    )
    assert "train.num_workers=1" in plan.problem
    assert "7 more CPU" in plan.problem
    assert "does not fit:" in plan.table()


def test_gpu_workers_on_a_cpu_only_fixed_cluster_cannot_fit():
    plan = training_plan(_config("train.use_gpu=true"), ClusterShape([Node(16)]))

    assert "2 GPU" in plan.problem and "2 more GPU" in plan.problem


def test_autoscaling_cluster_that_fits_once_nodes_are_added_waits_instead_of_failing():
    # cluster/aws.yaml's shape: a CPU head, GPU workers added on demand.
    cluster = ClusterShape([Node(8)], [("gpu_worker", Node(8, 1), 4)])
    plan = training_plan(
        _config("train.num_workers=4", "train.use_gpu=true", "train.cpus_per_worker=4"), cluster
    )

    assert plan.needs_nodes and not plan.fits_now and plan.problem is None
    assert "fits once the autoscaler adds nodes" in plan.table()
    assert "autoscaling: gpu_worker ≤4 × 8 CPU/1 GPU" in plan.table()


def test_autoscaling_cluster_too_small_even_at_its_maximum_fails_now():
    cluster = ClusterShape([Node(8)], [("gpu_worker", Node(8, 1), 2)])
    plan = training_plan(_config("train.num_workers=4", "train.use_gpu=true"), cluster)

    assert "even with every node the autoscaler may add" in plan.problem
    assert "train.num_workers=2" in plan.problem


def test_tune_trial_drivers_are_part_of_the_plan():
    drivers = [Extra("Tune trial drivers", 2, 0.01)]
    # 2 concurrent trials × 2 workers on 4 CPUs: each worker lowered so that both trials,
    # their drivers and Ray Data's CPU fit.
    plan = compute_plan(ClusterShape([Node(4)]), 4, 1.0, False, 1.0, extras=drivers)

    assert plan.fits_now and plan.worker_cpu == 0.7
    assert "Tune trial drivers" in plan.table()


def test_annotation_actors_that_take_every_cpu_fail_naming_them():
    actors = [Extra("annotation actors", 2, 1.0)]
    plan = compute_plan(ClusterShape([Node(2)]), 0, 1.0, False, 1.0, extras=actors)

    assert "+ 2 CPU for annotation actors = 3 CPU" in plan.problem


def test_an_annotation_pool_on_its_own_leaves_ray_data_a_whole_cpu():
    two_cpus = ClusterShape([Node(2)])
    # The default share (annotate.py: default_cpus_per_actor) fits beside Ray Data's CPU.
    plan = pool_plan(two_cpus, Extra("annotation actors", 2, 0.5))
    assert plan.fits_now and plan.problem is None
    table = plan.table()
    assert "annotation actors" in table and "Ray Train workers" not in table
    # Two whole-CPU actors take both CPUs: the read tasks would never run.
    plan = pool_plan(
        two_cpus, Extra("annotation actors", 2, 1.0), fix="annotation.concurrency or x"
    )
    assert plan.problem == (
        "2 annotation actors × 1 CPU + Ray Data 1 CPU (its read and write tasks, whole CPUs) "
        "= 3 CPU; this cluster has 2 CPU on 1 node (largest: 2 CPU). Lower "
        "annotation.concurrency or x"
    )
    # Each actor sits on one node: 2 × 1.5 CPU do not fit two 2-CPU nodes with Ray Data's CPU.
    assert pool_plan(ClusterShape([Node(2), Node(2)]), Extra("a", 2, 1.5)).problem


def test_an_annotation_pool_waits_for_the_autoscaler_when_nodes_would_fit_it():
    head_only = ClusterShape([Node(0)], node_types=[("gpu", Node(4, 1), 2)])
    plan = pool_plan(head_only, Extra("annotation actors", 2, 1.0, 1.0))
    assert plan.needs_nodes and not plan.fits_now and plan.problem is None
    too_many = pool_plan(head_only, Extra("annotation actors", 3, 1.0, 1.0))
    assert "even with every node the autoscaler may add" in too_many.problem


def test_new_keys_are_validated_naming_the_key():
    with pytest.raises(ConfigError, match=r"train.data_cpus: must be >= 1"):
        _config("train.data_cpus=0.5")
    with pytest.raises(ConfigError, match=r"train.stall_timeout_s: must be > 0 or null"):
        _config("train.stall_timeout_s=0")


# ---------------------------------------------------------------------------------------------
# The watchdog, with an injected stall
# ---------------------------------------------------------------------------------------------


def test_watchdog_fails_a_stalled_run_naming_what_waits_and_for_which_resources():
    read = Waiting("task", "t1", "ReadCorpus->SplitBlocks(4)", {"CPU": 1.0})
    interrupted = threading.Event()
    watchdog = StallWatchdog(
        0.3, poll_s=0.05, probe=lambda: ([read], None), interrupt=interrupted.set, hint="fix: X"
    )
    with watchdog:
        assert interrupted.wait(30)

    with pytest.raises(StallError) as stalled:
        watchdog.check()
    message = str(stalled.value)
    assert "waited 0.3 s (train.stall_timeout_s)" in message
    assert "1 task 'ReadCorpus->SplitBlocks(4)' waiting for {CPU: 1} each" in message
    assert message.endswith("fix: X")


def test_watchdog_leaves_a_run_whose_waits_come_and_go_alone():
    # A new task every poll: something is always pending, nothing waits long. Not a stall.
    counter = iter(range(10**6))
    polls = threading.Event()
    seen = []

    def probe():
        seen.append(1)
        if len(seen) > 20:
            polls.set()
        return [Waiting("task", f"t{next(counter)}", "Map", {"CPU": 1.0})], None

    watchdog = StallWatchdog(0.3, poll_s=0.02, probe=probe, interrupt=pytest.fail)
    with watchdog:
        assert polls.wait(30)
    watchdog.check()


def test_a_probe_problem_is_reported_once_per_process_not_once_per_watchdog(caplog, monkeypatch):
    # Evaluation starts one watchdog per task; a local Ray without the dashboard answers each
    # the same way. One line says so, not one per task.
    from distributed_emb import watchdog

    monkeypatch.setattr(watchdog.PROBE_REPEATS, "counts", {})  # as in a fresh process
    problem = "Ray's state API did not answer (ServerUnavailable: no dashboard)"
    for _ in range(3):
        polled = threading.Event()

        def probe(polled=polled):
            polled.set()
            return [], problem

        with caplog.at_level("WARNING", logger="distributed_emb.watchdog"):
            with StallWatchdog(60.0, poll_s=0.01, probe=probe, interrupt=pytest.fail):
                assert polled.wait(30)
    shown = [r for r in caplog.records if "state API did not answer" in r.getMessage()]
    assert len(shown) == 1 and "watching placement groups only" in shown[0].getMessage()


def test_a_stall_aborts_the_wait_even_after_an_earlier_fit_left_its_sigint_handler():
    # Ray Tune and Ray Train install SIGINT handlers and leave them after fit(); Tune's only
    # sets a flag. Before no_silent_stall started its block with Python's own handler, such a
    # leftover swallowed the abort, and the stalled wait ran on to its own end.
    from distributed_emb.watchdog import no_silent_stall

    swallowed = []

    def leftover_handler(signum, frame):
        swallowed.append(signum)

    before = signal.signal(signal.SIGINT, leftover_handler)
    stuck = Waiting("placement group", "pg1", "encoding-pool (3 bundles)", {"CPU": 3.0})
    wait_ran_to_its_end = False
    try:
        with pytest.raises(StallError, match="encoding-pool"):
            with no_silent_stall(0.3, probe=lambda: ([stuck], None)):
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    time.sleep(0.05)
                wait_ran_to_its_end = True
        assert not wait_ran_to_its_end and swallowed == []
        # The handler the block found is the one it leaves.
        assert signal.getsignal(signal.SIGINT) is leftover_handler
    finally:
        signal.signal(signal.SIGINT, before)


# ---------------------------------------------------------------------------------------------
# On real Ray clusters (ray.cluster_utils.Cluster: loopback, its own ports)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def zero_cpu_head():
    """One cluster for the module: a head with no CPU, this process connected as its driver.
    Each test adds the worker nodes it needs (`cluster` removes them again)."""
    import ray
    from ray.cluster_utils import Cluster

    ray.shutdown()
    made = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "object_store_memory": 80 * 1024**2},
    )
    yield made
    ray.shutdown()
    made.shutdown()


def _wait_for_cpus(cluster, expected: int) -> None:
    """Until Ray's view holds the `expected` CPUs of the nodes added (so the plan sees the
    whole cluster)."""
    cluster.wait_for_nodes()
    deadline = time.monotonic() + 60
    while _alive_cpus() < expected and time.monotonic() < deadline:
        time.sleep(0.1)


def _alive_cpus() -> float:
    import ray

    return sum(n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n["Alive"])


@pytest.fixture
def cluster(zero_cpu_head):
    """The module's cluster with its head alone and this process connected; the worker nodes
    the test adds are removed after it, and their CPUs gone from Ray's view, before the next
    test sees the cluster."""
    import ray

    if not ray.is_initialized():
        ray.init(address=zero_cpu_head.address)
    yield zero_cpu_head
    for node in list(zero_cpu_head.worker_nodes):
        zero_cpu_head.remove_node(node)
    deadline = time.monotonic() + 60
    while _alive_cpus() > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive_cpus() == 0, "a removed node is still alive in Ray's view"


@pytest.mark.ray
def test_zero_cpu_head_plus_worker_nodes_seen_from_ray(cluster):

    for _ in range(2):
        cluster.add_node(num_cpus=1, object_store_memory=80 * 1024**2)
    _wait_for_cpus(cluster, 2)

    shape = cluster_from_ray()
    assert sorted(n.cpu for n in shape.nodes) == [0, 1, 1] and not shape.autoscaling
    plan = check_training_plan(_config())
    assert plan.worker_cpu == 0.5
    with pytest.raises(PlanError, match=r"9 CPU; this cluster has 2 CPU on 3 nodes"):
        check_training_plan(_config("train.num_workers=8"))


@pytest.mark.ray
def test_never_fitting_run_fails_before_ray_train_starts(cluster, tmp_path, monkeypatch):

    from distributed_emb.train import driver

    cluster.add_node(num_cpus=2, object_store_memory=80 * 1024**2)
    _wait_for_cpus(cluster, 2)
    built = []
    monkeypatch.setattr(driver, "build_trainer", lambda *a, **k: built.append(a))

    from harness.tiny_run import unread_stream

    config = _config("train.num_workers=8", "train.max_steps=2", f"output.dir={tmp_path}")
    with pytest.raises(PlanError, match=r"train.num_workers=1"):
        driver.run_training(config, stream=unread_stream())
    assert built == []


@pytest.mark.ray
def test_watchdog_names_a_worker_group_that_can_never_be_placed(cluster):
    from ray.util.placement_group import placement_group, remove_placement_group

    cluster.add_node(num_cpus=2, object_store_memory=80 * 1024**2)
    _wait_for_cpus(cluster, 2)
    # What Ray Train asks for 4 workers × 1 CPU, on a 2-CPU cluster.
    group = placement_group([{"CPU": 1.0}] * 4, name="train-workers")
    interrupted = threading.Event()
    try:
        with StallWatchdog(1.0, poll_s=0.2, interrupt=interrupted.set) as watchdog:
            assert interrupted.wait(60)
    finally:
        remove_placement_group(group)

    with pytest.raises(StallError) as stalled:
        watchdog.check()
    message = str(stalled.value)
    assert "placement group 'train-workers (4 bundles)' waiting for {CPU: 4}" in message
    assert "cluster now: CPU 2 of 2 free" in message


@pytest.mark.ray
def test_an_encoding_pool_that_can_never_fit_fails_before_any_actor_starts(cluster):

    from distributed_emb.model.embedder import ray_encode

    cluster.add_node(num_cpus=1, object_store_memory=80 * 1024**2)
    _wait_for_cpus(cluster, 1)
    # One whole-CPU actor on a 1-CPU cluster leaves Ray Data's read tasks no CPU: before, the
    # encode waited forever. The model path is never opened: the plan fails first.
    with pytest.raises(PlanError, match=r"encoding actors do not fit the cluster: 1 encoding"):
        ray_encode(["a", "b"], "no-such-model", num_cpus_per_actor=1.0)


@pytest.mark.ray
def test_a_driver_wait_that_never_ends_fails_naming_what_waits(cluster, monkeypatch):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    from distributed_emb import watchdog
    from distributed_emb.watchdog import no_silent_stall

    # A wait that missed the interrupt fails this test, never the whole pytest process.
    monkeypatch.setattr(watchdog, "ABORT_GRACE_S", 3600.0)

    cluster.add_node(num_cpus=1, object_store_memory=80 * 1024**2)
    _wait_for_cpus(cluster, 1)
    # What an actor pool asks of a cluster too small for it, waited on from the driver as
    # ray_encode and annotation wait on their pools: the wait ends in StallError, not never.
    group = placement_group([{"CPU": 1.0}] * 3, name="encoding-pool")
    wait_ran_to_its_end = False
    try:
        with pytest.raises(StallError) as stalled:
            with no_silent_stall(1.0, hint="fix: fewer actors"):
                deadline = time.monotonic() + 300
                # Short waits in a Python loop, as ray_encode and annotation consume their
                # pools' output: the interrupt lands between two of them.
                while time.monotonic() < deadline:
                    ray.wait([group.ready()], timeout=0.5)
                wait_ran_to_its_end = True
    finally:
        remove_placement_group(group)
    assert not wait_ran_to_its_end, "the abort did not interrupt the wait"
    message = str(stalled.value)
    assert "placement group 'encoding-pool (3 bundles)' waiting for {CPU: 3}" in message
    assert message.endswith("fix: fewer actors")


def test_annotation_stall_timeout_is_validated():
    from distributed_emb.config import load_config
    from distributed_emb.infocse.rounds_config import InfoCSEConfig

    with pytest.raises(ValueError, match=r"annotation.stall_timeout_s: must be > 0 or null, got 0"):
        load_config(InfoCSEConfig, None, ["annotation.stall_timeout_s=0"])
    config = load_config(InfoCSEConfig, None, ["annotation.stall_timeout_s=null"])
    assert config.annotation.stall_timeout_s is None


@pytest.mark.ray
def test_a_local_ray_without_the_dashboard_is_not_asked_and_no_warning_is_shown(
    caplog, monkeypatch
):
    # A laptop run starts Ray without the dashboard (runtime.start_ray): its State API cannot
    # answer, which is expected there, so the watchdog watches placement groups only and says
    # so at INFO, instead of warning about a failed connection in every run.
    import ray

    from distributed_emb import watchdog

    asked = []
    original = watchdog.pending_work

    def recording(*args, **kwargs):
        asked.append(kwargs.get("ask_state_api", True))
        return original(*args, **kwargs)

    monkeypatch.setattr(watchdog, "pending_work", recording)
    ray.shutdown()
    ray.init(address="local", num_cpus=1, include_dashboard=False)
    try:
        assert not watchdog.state_api_served()
        with caplog.at_level("INFO", logger="distributed_emb.watchdog"):
            with StallWatchdog(60.0, poll_s=0.05, interrupt=pytest.fail):
                deadline = time.monotonic() + 30
                while len(asked) < 2 and time.monotonic() < deadline:
                    time.sleep(0.05)
    finally:
        ray.shutdown()
    assert len(asked) >= 2 and not any(asked)
    ours = [r for r in caplog.records if r.name.startswith("distributed_emb.watchdog")]
    assert [r.getMessage() for r in ours if r.levelname == "WARNING"] == []
    assert any("no dashboard" in r.getMessage() for r in ours)
