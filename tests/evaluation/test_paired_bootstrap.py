"""Paired bootstrap intervals against a plain numpy percentile bootstrap on the same draws."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from distributed_emb.evaluation.paired_bootstrap import (
    PairedDifference,
    _spearman_difference_of_counts,
    paired_mean_difference,
    paired_spearman_difference,
)

N_RESAMPLES = 1000


@pytest.fixture(scope="module")
def sts_like() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """200 pairs: gold scores 0–5 in steps of 0.5 (ties, like STS), two noisy models of it,
    the candidate a little less noisy."""
    rng = np.random.default_rng(7)
    gold = rng.integers(0, 11, size=200) / 2.0
    baseline = gold + rng.normal(0.0, 2.0, size=200)
    candidate = gold + rng.normal(0.0, 1.6, size=200)
    return gold, baseline, candidate


def _reference_draws(seed: int, n: int) -> np.ndarray:
    # scipy draws all resamples' item indices at once from the seeded Generator: (B, n)
    return np.random.default_rng(seed).integers(0, n, size=(N_RESAMPLES, n))


def _spearman_x100(x: np.ndarray, y: np.ndarray) -> float:
    return 100.0 * spearmanr(x, y).statistic


def test_spearman_interval_is_close_to_a_plain_percentile_bootstrap(sts_like):
    gold, baseline, candidate = sts_like
    result = paired_spearman_difference(gold, baseline, candidate, seed=3, n_resamples=N_RESAMPLES)
    assert result.baseline == pytest.approx(_spearman_x100(baseline, gold))
    assert result.candidate == pytest.approx(_spearman_x100(candidate, gold))
    assert result.difference == pytest.approx(result.candidate - result.baseline)
    differences = [
        _spearman_x100(candidate[i], gold[i]) - _spearman_x100(baseline[i], gold[i])
        for i in _reference_draws(3, len(gold))
    ]
    low, high = np.percentile(differences, [2.5, 97.5])
    # BCa shifts the percentile interval a little; same draws, so only a little.
    assert result.method == "BCa"
    assert result.low == pytest.approx(low, abs=0.15 * (high - low))
    assert result.high == pytest.approx(high, abs=0.15 * (high - low))
    assert (result.n, result.n_resamples, result.seed, result.confidence) == (200, 1000, 3, 0.95)


def test_the_resample_statistic_is_spearmanr_of_the_resampled_pairs(sts_like):
    """The count-based statistic (mid-ranks from each array's fixed order) against scipy's
    Spearman of the materialised resamples: repeated draws and tied gold scores included."""
    gold, baseline, candidate = sts_like
    draws = _reference_draws(0, len(gold))[:20]  # (20, n)
    counts = np.stack([np.bincount(row, minlength=len(gold)) for row in draws])
    fast = _spearman_difference_of_counts(gold, baseline, candidate)(counts.astype(np.int32))
    plain = [
        _spearman_x100(candidate[i], gold[i]) - _spearman_x100(baseline[i], gold[i]) for i in draws
    ]
    np.testing.assert_allclose(fast, plain, rtol=0, atol=1e-9)


def test_mean_interval_is_close_to_a_plain_percentile_bootstrap():
    rng = np.random.default_rng(1)
    baseline = rng.uniform(0.0, 100.0, size=150)  # per-query nDCG@10 × 100, say
    candidate = np.clip(baseline + rng.normal(2.0, 10.0, size=150), 0.0, 100.0)
    result = paired_mean_difference(baseline, candidate, seed=5, n_resamples=N_RESAMPLES)
    assert result.difference == pytest.approx(candidate.mean() - baseline.mean())
    draws = _reference_draws(5, len(baseline))
    low, high = np.percentile((candidate - baseline)[draws].mean(axis=1), [2.5, 97.5])
    assert result.low == pytest.approx(low, abs=0.15 * (high - low))
    assert result.high == pytest.approx(high, abs=0.15 * (high - low))


def test_a_large_effect_excludes_zero(sts_like):
    gold, baseline, _ = sts_like
    sharp = gold + np.random.default_rng(2).normal(0.0, 0.3, size=len(gold))
    better = paired_spearman_difference(gold, baseline, sharp, n_resamples=N_RESAMPLES)
    assert better.low > 10 and better.excludes_zero()
    worse = paired_spearman_difference(gold, sharp, baseline, n_resamples=N_RESAMPLES)
    assert worse.high < -10 and worse.excludes_zero()
    per_query = np.linspace(0.0, 50.0, 80)
    gained = paired_mean_difference(per_query, per_query + 20.0, n_resamples=N_RESAMPLES)
    assert gained.low > 0 and gained.excludes_zero()


def test_identical_models_differ_by_zero_with_an_interval_holding_zero(sts_like):
    gold, baseline, _ = sts_like
    same = paired_spearman_difference(gold, baseline, baseline, n_resamples=N_RESAMPLES)
    assert same.difference == 0.0 and same.low <= 0.0 <= same.high
    assert not same.excludes_zero()
    assert same.method == "percentile"  # BCa is undefined when every resample gives 0
    also_same = paired_mean_difference(baseline, baseline, n_resamples=N_RESAMPLES)
    assert (also_same.difference, also_same.low, also_same.high) == (0.0, 0.0, 0.0)


def test_the_seed_makes_it_reproducible(sts_like):
    gold, baseline, candidate = sts_like
    first = paired_spearman_difference(gold, baseline, candidate, seed=11, n_resamples=200)
    again = paired_spearman_difference(gold, baseline, candidate, seed=11, n_resamples=200)
    other = paired_spearman_difference(gold, baseline, candidate, seed=12, n_resamples=200)
    assert first == again
    assert (other.low, other.high) != (first.low, first.high)
    assert other.difference == first.difference  # the point estimate does not resample


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: paired_mean_difference([1.0, 2.0, 3.0], [1.0, 2.0]), "lengths differ"),
        (lambda: paired_mean_difference([1.0], [2.0]), "at least 2 items, got 1"),
        (lambda: paired_mean_difference([1.0, np.nan], [2.0, 3.0]), "baseline_per_item: .*NaN"),
        (
            lambda: paired_spearman_difference([1, 2, 3], [1, 2, 3], [1, 2]),
            "lengths differ: gold 3, baseline_scores 3, candidate_scores 2",
        ),
        (lambda: paired_spearman_difference([1, 2], [3, 3], [1, 2]), "baseline_scores: every"),
        (lambda: paired_mean_difference([1, 2], [3, 4], confidence=95), "confidence"),
    ],
)
def test_bad_input_names_the_problem(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_format_and_as_dict():
    result = PairedDifference(80.0, 81.234, 1.234, 0.4, 2.05, 1379, 2000, 0, 0.95)
    assert result.format() == "+1.23 [+0.40, +2.05]"
    assert result.format(digits=1) == "+1.2 [+0.4, +2.0]"
    assert result.as_dict()["excludes_zero"] is True and result.as_dict()["method"] == "BCa"
    straddles = PairedDifference(80.0, 79.5, -0.5, -1.2, 0.3, 1379, 2000, 0, 0.95)
    assert straddles.format() == "-0.50 [-1.20, +0.30]" and not straddles.excludes_zero()
