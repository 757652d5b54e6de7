"""Search spaces: parsing, validation against TrainingConfig, trial overrides, Ray domains."""

from __future__ import annotations

import math

import numpy as np
import pytest

from distributed_emb.checks import ConfigError
from distributed_emb.config import TrainingConfig
from distributed_emb.tune.search_space import (
    DEFAULT_SEARCH_SPACE,
    Distribution,
    apply_params,
    grid_size,
    param_space,
    parse_search_space,
)

BASE = TrainingConfig()


def test_default_space_is_the_issues_space():
    space = parse_search_space(DEFAULT_SEARCH_SPACE, BASE)
    assert space == {
        "loss.reconstruction_weight": Distribution(
            "loss.reconstruction_weight", "loguniform", low=0.04, high=4.0
        ),
        "loss.mlm_weight": Distribution("loss.mlm_weight", "choice", values=(0.0, 0.01, 0.1)),
        "train.learning_rate": Distribution(
            "train.learning_rate", "loguniform", low=1e-5, high=5e-5
        ),
        "train.batch_size": Distribution("train.batch_size", "choice", values=(64, 128, 256)),
    }


def test_nested_and_dotted_forms_are_the_same_space_and_null_drops_a_key():
    nested = {"loss": {"mlm_weight": {"type": "choice", "values": [0.0, 0.1]}}, "train": None}
    dotted = {"loss.mlm_weight": {"type": "choice", "values": [0.0, 0.1]}}
    assert parse_search_space(nested, BASE) == parse_search_space(dotted, BASE)
    with_null = {**dotted, "train.learning_rate": None}
    assert list(parse_search_space(with_null, BASE)) == ["loss.mlm_weight"]


@pytest.mark.parametrize(
    "tree, message",
    [
        ({"loss.lambda": {"type": "uniform", "low": 0, "high": 1}}, "search.loss.lambda: 'lambda'"),
        ({"loss": {"type": "uniform", "low": 0, "high": 1}}, "search.loss: is a section"),
        ({"data.max_rows": {"type": "choice", "values": [10]}}, "search.data.max_rows: only keys"),
        # batch size is an int: a uniform float range cannot be applied to it
        (
            {"train.batch_size": {"type": "uniform", "low": 8, "high": 64}},
            "train.batch_size: expected an integer",
        ),
        # each listed value is validated like a config value
        (
            {"train.learning_rate": {"type": "choice", "values": [1e-5, -1e-5]}},
            "train.learning_rate: must be > 0",
        ),
        (
            {"train.learning_rate": {"type": "loguniform", "low": 0, "high": 1e-4}},
            "loguniform needs low > 0",
        ),
        ({"loss.temperature": {"type": "uniform", "low": 0.1, "high": 0.1}}, "must be below"),
        ({"loss.temperature": {"type": "normal", "low": 0.1, "high": 0.2}}, "'normal' is not"),
        ({"loss.temperature": {"type": "choice", "values": []}}, "non-empty list"),
        ({"loss.temperature": {"type": "choice", "values": [0.1, 0.1]}}, "repeated values"),
        ({"loss.temperature": {"type": "uniform", "low": "a", "high": 1}}, ".low: expected"),
        ({"loss.temperature": {"type": "uniform", "low": 0.1, "high": 1, "q": 2}}, "unknown"),
        ({"loss.temperature": 0.1}, "expected a distribution"),
        ({"loss.mlm_weight": None}, "no key is searched"),
        (
            {"loss.mlm_weight": {"type": "grid", "values": [0.0]}, "loss": {"mlm_weight": None}},
            "given twice",
        ),
    ],
)
def test_bad_spaces_are_rejected_naming_the_key(tree, message):
    with pytest.raises(ConfigError) as error:
        parse_search_space(tree, BASE)
    assert message in str(error.value)


def test_yaml11_exponent_strings_are_numbers():
    space = parse_search_space(
        {"train.learning_rate": {"type": "loguniform", "low": "1e-5", "high": "5e-5"}}, BASE
    )
    assert space["train.learning_rate"].low == 1e-5


def test_apply_params_sets_values_validates_and_leaves_the_base_alone():
    config = apply_params(
        BASE, {"loss.reconstruction_weight": 0.4, "train.batch_size": np.int64(64)}
    )
    assert config.loss.reconstruction_weight == 0.4
    assert config.train.batch_size == 64 and type(config.train.batch_size) is int  # numpy → int
    assert BASE.loss.reconstruction_weight == 0.1 and BASE.train.batch_size == 32
    with pytest.raises(ConfigError, match="trial: loss.temperature: must be > 0"):
        apply_params(BASE, {"loss.temperature": 0.0})
    with pytest.raises(ConfigError, match="'loss.nope' is not a TrainingConfig key"):
        apply_params(BASE, {"loss.nope": 1.0})


def test_loguniform_domain_samples_uniformly_in_log_space():
    """Against the plain definition: log(x) ~ U(log low, log high). A uniform draw over
    [0.04, 4] would put only 9% of the samples below the geometric midpoint 0.4."""
    space = parse_search_space(
        {"loss.reconstruction_weight": {"type": "loguniform", "low": 0.04, "high": 4.0}}, BASE
    )
    domain = param_space(space)["loss.reconstruction_weight"]
    samples = np.array(domain.sample(size=4000, random_state=np.random.default_rng(0)))
    assert samples.min() >= 0.04 and samples.max() <= 4.0
    below_midpoint = np.mean(samples < math.sqrt(0.04 * 4.0))
    assert abs(below_midpoint - 0.5) < 0.03
    # quartiles of log(x) at 1/4 and 3/4 of the way through [log 0.04, log 4]
    logs = np.log(samples)
    lo, hi = math.log(0.04), math.log(4.0)
    np.testing.assert_allclose(
        np.quantile(logs, [0.25, 0.75]), [lo + (hi - lo) / 4, lo + 3 * (hi - lo) / 4], atol=0.1
    )


def test_choice_samples_only_listed_values_and_grid_enumerates():
    space = parse_search_space(
        {
            "loss.mlm_weight": {"type": "choice", "values": [0.0, 0.01, 0.1]},
            "train.batch_size": {"type": "grid", "values": [16, 32]},
            "loss.temperature": {"type": "grid", "values": [0.05, 0.1, 0.2]},
        },
        BASE,
    )
    domains = param_space(space)
    samples = set(
        domains["loss.mlm_weight"].sample(size=300, random_state=np.random.default_rng(0))
    )
    assert samples == {0.0, 0.01, 0.1}
    assert domains["train.batch_size"] == {"grid_search": [16, 32]}
    assert grid_size(space) == 6
