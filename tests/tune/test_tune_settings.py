"""The search job's config: the shipped YAMLs load, overrides reach search/tune, bad
combinations are refused before Ray starts."""

from __future__ import annotations

import pytest

from distributed_emb.checks import ConfigError
from distributed_emb.config import load_config
from distributed_emb.tune.search_config import SearchJobConfig, asha_budget
from distributed_emb.tune.search_space import DEFAULT_SEARCH_SPACE, parse_search_space

DEFAULT_YAML = "jobs/configs/tune_default.yaml"


def test_default_yaml_searches_the_issues_keys_with_laptop_batches():
    config = load_config(SearchJobConfig, DEFAULT_YAML, [])
    full = parse_search_space(DEFAULT_SEARCH_SPACE, config.base())
    space = config.space()
    assert list(space) == list(full)
    for key in ("loss.reconstruction_weight", "loss.mlm_weight", "train.learning_rate"):
        assert space[key] == full[key]
    assert space["train.batch_size"].values == (16, 32)  # narrowed for 2 cores, see the YAML
    assert config.model.path is None  # the packaged MiniLM
    assert (config.tune.scheduler, config.tune.num_samples) == ("asha", 4)
    assert asha_budget(config) == (10, 30)


def test_tiny_yaml_loads_with_a_model_path(tiny_bert_path):
    config = load_config(
        SearchJobConfig, "jobs/configs/tune_tiny.yaml", [f"model.path={tiny_bert_path}"]
    )
    assert config.train.max_steps == 4 and asha_budget(config) == (2, 4)


def test_overrides_reach_one_search_key_and_the_tune_section():
    config = load_config(
        SearchJobConfig,
        DEFAULT_YAML,
        [
            "search.train.batch_size={type: choice, values: [64, 128, 256]}",
            "tune.num_samples=8",
            "search.loss.mlm_weight=null",
        ],
    )
    space = config.space()
    assert space["train.batch_size"].values == (64, 128, 256)
    assert "loss.mlm_weight" not in space and "loss.reconstruction_weight" in space
    assert config.tune.num_samples == 8


def test_base_is_a_training_config_without_the_search_sections():
    config = load_config(SearchJobConfig, DEFAULT_YAML, ["train.max_steps=7"])
    base = config.base()
    assert type(base).__name__ == "TrainingConfig" and base.train.max_steps == 7
    base.train.max_steps = 9
    assert config.train.max_steps == 7  # a copy


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["tune.searcher=optuna", "search.train.batch_size={type: grid, values: [16, 32]}"],
            "search.train.batch_size: type grid needs tune.searcher=random",
        ),
        (["train.max_steps=null"], "tune.max_t: set it, or train.max_steps"),
        (["tune.grace_period=40"], "tune.max_t: (30) must be >= tune.grace_period (40)"),
        (["tune.reduction_factor=1"], "tune.reduction_factor: must be > 1"),
        (["tune.num_samples=0"], "tune.num_samples: must be >= 1"),
        (
            ["tune.scheduler=hyperband"],
            "tune.scheduler: expected one of ['asha', 'fifo'], got 'hyperband'",
        ),
        (["train.layout=auto"], "train.layout: auto is for a single training run"),
        (
            ["search.loss.temperature={type: uniform, low: -1, high: 1}"],
            "search.loss.temperature: loss.temperature: must be > 0",
        ),
    ],
)
def test_bad_search_configs_fail_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as error:
        load_config(SearchJobConfig, DEFAULT_YAML, overrides)
    assert message in str(error.value)


def test_training_iteration_budget_counts_reports():
    config = load_config(SearchJobConfig, DEFAULT_YAML, ["tune.time_attr=training_iteration"])
    # reports at steps 0, 10, 20, 30: the first after training is report 2, the last is 4
    assert asha_budget(config) == (2, 4)
    # without ASHA no budget is needed
    load_config(SearchJobConfig, DEFAULT_YAML, ["tune.scheduler=fifo", "train.max_steps=null"])
