"""Driver pieces that need no Ray cluster: concurrency from resources, pre-flight batch check,
scheduler and searcher wiring."""

from __future__ import annotations

import pytest

from distributed_emb.checks import ConfigError
from distributed_emb.config import load_config
from distributed_emb.resource_plan import ClusterShape, Node
from distributed_emb.selection import SELECT_METRIC
from distributed_emb.tune.driver import (
    build_scheduler,
    build_searcher,
    build_tune_config,
    check_batches_fit,
    derive_max_concurrent_trials,
    resources_per_trial,
    search_plan,
    trial_worker_cpus,
    worker_bundles,
)
from distributed_emb.tune.search_config import SearchJobConfig

DEFAULT_YAML = "jobs/configs/tune_default.yaml"


@pytest.mark.parametrize(
    "cluster, per_trial, expected",
    [
        # a trial is 2 workers × 1 CPU; its driver reserves memory, no CPU
        ({"CPU": 3.99}, {"CPU": 2.0, "GPU": 0}, 1),
        ({"CPU": 4.0}, {"CPU": 2.0, "GPU": 0}, 2),
        ({"CPU": 5.0}, {"CPU": 2.0, "GPU": 0}, 2),
        ({"CPU": 64.0, "GPU": 8.0}, {"CPU": 4.0, "GPU": 4.0}, 2),  # GPUs limit
        ({"CPU": 7.99, "GPU": 8.0}, {"CPU": 4.0, "GPU": 1.0}, 1),  # CPUs limit
        ({"CPU": 1.0}, {"CPU": 2.0, "GPU": 0}, 1),  # never 0: an autoscaler may add nodes
    ],
)
def test_max_concurrent_trials_from_cluster_resources(cluster, per_trial, expected):
    assert derive_max_concurrent_trials(cluster, per_trial) == expected


def test_resources_per_trial_take_the_largest_searched_worker_count():
    config = load_config(
        SearchJobConfig,
        DEFAULT_YAML,
        ["search.train.num_workers={type: choice, values: [1, 4]}", "train.cpus_per_worker=2"],
    )
    assert resources_per_trial(config.base(), config.space()) == {"CPU": 8.0, "GPU": 0}


def test_batches_larger_than_the_corpus_allows_fail_before_any_trial():
    config = load_config(
        SearchJobConfig, DEFAULT_YAML, ["search.train.batch_size={type: choice, values: [16, 256]}"]
    )
    check_batches_fit(config.base(), config.space(), num_rows=600)  # 600 ≥ 2 × 256: fine
    with pytest.raises(ConfigError, match=r"search.train.batch_size=256: 300 rows give no full"):
        check_batches_fit(config.base(), config.space(), num_rows=300)


def test_asha_judges_at_evaluation_steps():
    config = load_config(SearchJobConfig, DEFAULT_YAML, [])
    scheduler = build_scheduler(config)
    assert type(scheduler).__name__ == "AsyncHyperBandScheduler"
    assert scheduler._time_attr == "step" and scheduler._max_t == 30
    # rungs (where trials are compared): the evaluations at steps 10 and 20
    assert sorted(m for m, _ in scheduler._brackets[0]._rungs) == [10, 20]
    fifo = build_scheduler(load_config(SearchJobConfig, DEFAULT_YAML, ["tune.scheduler=fifo"]))
    assert type(fifo).__name__ == "FIFOScheduler"


def test_the_search_compares_trials_on_what_eval_select_by_names(tmp_path):
    """Tune's metric is the selection score every evaluation reports; a search chosen on a
    retrieval split hands every trial that choice, and eval cannot be searched (trials
    compared on different scores)."""
    from harness.tiny_run import tiny_beir_dir

    chosen = [f"eval.retrieval_dir={tiny_beir_dir(tmp_path)}", "eval.select_by=retrieval:dev"]
    config = load_config(SearchJobConfig, DEFAULT_YAML, chosen)
    tune_config = build_tune_config(config, 2)
    assert (tune_config.metric, tune_config.mode) == (SELECT_METRIC, "max")
    assert config.base().eval.select_by == "retrieval:dev"  # what each trial reports as it
    with pytest.raises(ConfigError, match=r"^search\.eval\.select_by: only keys of"):
        load_config(
            SearchJobConfig,
            DEFAULT_YAML,
            [*chosen, "search.eval.select_by={type: choice, values: [stsb_dev, retrieval:dev]}"],
        )


def test_concurrency_limit_reaches_the_searcher_that_enforces_it():
    """Tune ignores TuneConfig.max_concurrent_trials for a BasicVariantGenerator instance (it
    ran all trials at once, and they fought for the workers' CPUs): the generator gets it."""
    random_searcher, tune_limit = build_searcher(load_config(SearchJobConfig, DEFAULT_YAML, []), 3)
    assert random_searcher.max_concurrent == 3 and tune_limit is None
    optuna, tune_limit = build_searcher(
        load_config(SearchJobConfig, DEFAULT_YAML, ["tune.searcher=optuna"]), 3
    )
    assert type(optuna).__name__ == "OptunaSearch" and tune_limit == 3


def test_worker_bundles_cover_every_searched_worker_shape():
    config = load_config(
        SearchJobConfig,
        DEFAULT_YAML,
        ["search.train.use_gpu={type: choice, values: [false, true]}"],
    )
    # build_trainer's resources_per_worker: no GPU key without GPUs (the janitor ignores zeros).
    assert worker_bundles(config.base(), config.space()) == [{"CPU": 1.0}, {"CPU": 1.0, "GPU": 1}]


@pytest.mark.parametrize(
    "cluster, data_cpus, expected",
    [
        ({"CPU": 4.99}, 1.0, 1),  # Ray Data's CPU first: 3.99 left, one 2-CPU trial
        ({"CPU": 5.0}, 1.0, 2),
        ({"CPU": 7.0}, 1.0, 3),
        ({"CPU": 2.0}, 1.0, 1),  # never 0: the plan lowers the workers' reservations
    ],
)
def test_ray_datas_share_comes_before_concurrent_trials(cluster, data_cpus, expected):
    per_trial = {"CPU": 2.0, "GPU": 0}
    assert derive_max_concurrent_trials(cluster, per_trial, data_cpus) == expected


def test_never_more_trials_side_by_side_than_the_search_has():
    # 9 CPUs fit four 2-CPU trials after Ray Data's CPU, but a 2-trial search runs 2: planned
    # for 4, every worker's reservation was lowered to 1.5 CPU for trials that never come.
    per_trial = {"CPU": 2.0, "GPU": 0}
    assert derive_max_concurrent_trials({"CPU": 9.0}, per_trial, 1.0) == 4
    assert derive_max_concurrent_trials({"CPU": 9.0}, per_trial, 1.0, total_trials=2) == 2
    base, space = _search("train.num_workers=1", "train.cpus_per_worker=2")
    three_nodes = ClusterShape([Node(cpu=0.0)] + [Node(cpu=3.0)] * 3)
    assert search_plan(base, space, three_nodes, concurrent=4).lowered
    plan = search_plan(base, space, three_nodes, concurrent=2)
    assert not plan.lowered and plan.worker_cpu == 2.0


def _search(*overrides):
    config = load_config(SearchJobConfig, DEFAULT_YAML, list(overrides))
    return config.base(), config.space()


def test_the_default_search_fits_a_2_core_machine_by_lowering_worker_reservations():
    base, space = _search()
    plan = search_plan(base, space, ClusterShape([Node(cpu=2.0)]), concurrent=1)
    assert plan.problem is None and plan.lowered
    # 2 workers must leave one whole CPU for Ray Data on the only node (the driver takes none).
    assert plan.worker_cpu == pytest.approx(0.5)
    assert 2 * plan.worker_cpu <= 1.0
    # Every trial is built with the lowered reservation, and the janitor looks for it.
    assert trial_worker_cpus(base, plan.worker_cpu) == pytest.approx(0.5)
    assert worker_bundles(base, space, plan.worker_cpu) == [{"CPU": 0.5}]


def test_concurrent_trials_are_planned_together():
    base, space = _search()
    four_cpus = ClusterShape([Node(cpu=4.0)])
    assert not search_plan(base, space, four_cpus, concurrent=1).lowered  # 2 + 1 ≤ 4
    two_side_by_side = search_plan(base, space, four_cpus, concurrent=2)
    assert two_side_by_side.lowered and two_side_by_side.workers == 4


def test_a_search_that_can_never_fit_names_the_numbers():
    base, space = _search("train.num_workers=8", "train.lower_cpus_to_fit=false")
    plan = search_plan(base, space, ClusterShape([Node(cpu=2.0)]), concurrent=1)
    assert plan.problem and "8 Train workers" in plan.problem


def test_a_searched_smaller_reservation_is_never_raised_by_the_plan():
    base, _ = _search("train.cpus_per_worker=0.3")
    assert trial_worker_cpus(base, 0.45) == pytest.approx(0.3)
    assert trial_worker_cpus(base, None) is None


def test_a_trial_keeps_its_logs_on_the_searchs_storage(monkeypatch, tmp_path):
    """With output.storage_path, each trial's rank 0 keeps run.log, train_log.jsonl and
    tensorboard/ at <storage>/<trial's run name>/logs/ (on a cluster its node may be gone when
    the search ends); without one, its local trials/<run name>/ only."""
    from types import SimpleNamespace

    from distributed_emb.config import TrainingConfig, load_config, to_dict
    from distributed_emb.tune import driver

    started = []

    def fake_build_trainer(config, stream, run_name, **options):
        started.append((run_name, options["stored_logs"], config.output.dir))
        raise RuntimeError("stop before training")

    monkeypatch.setattr(driver, "build_trainer", fake_build_trainer)
    monkeypatch.setattr(driver, "TuneReportCallback", lambda: None)  # needs a Tune session
    monkeypatch.setattr(
        driver.ray_tune, "get_context", lambda: SimpleNamespace(get_trial_id=lambda: "t1")
    )
    for storage in ("s3://bucket/runs", None):
        overrides = [f"output.dir={tmp_path}"]
        if storage:
            overrides.append(f"output.storage_path={storage}")
        base = to_dict(load_config(TrainingConfig, None, overrides))
        with pytest.raises(RuntimeError, match="stop before training"):
            driver.run_trial({}, base=base, stream=object(), name="search")
    assert started == [
        ("search-t1", "s3://bucket/runs/search-t1/logs", f"{tmp_path}/trials/search-t1"),
        ("search-t1", None, f"{tmp_path}/trials/search-t1"),
    ]
