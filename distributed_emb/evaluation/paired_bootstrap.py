"""Paired bootstrap intervals of a difference between two models scored on the same items.

Why paired: both models are scored on the *same* queries or sentence pairs, so what makes an
item hard or easy is shared by the two scores and cancels in their difference. Resampling the
items once and scoring both models on that one resample measures only the uncertainty of the
difference; two independent intervals (one per model) would carry each item's difficulty twice
and come out several times wider. What is resampled is the item, never the model: the queries of
a retrieval set (a per-query metric such as nDCG@10 or 1/rank, averaged) or the sentence pairs
of an STS set (Spearman × 100 of each model's cosines against the gold scores, recomputed on the
resample).

The interval is scipy's bias-corrected and accelerated (BCa) bootstrap
(``scipy.stats.bootstrap``), seeded by ``numpy.random.default_rng(seed)``, so the same inputs
and seed give the same interval. Where BCa is undefined (every resample gives the same
difference, e.g. two identical models) the percentile interval of the same resamples is used
and ``method`` says so.

How the pairing is done: ``paired=True`` in scipy resamples an array of item indices and
indexes every input with it. We hand scipy that index array ourselves (the one sample), so the
statistic sees each resample as how many times it drew each item (a (B, n) count matrix) and
scores both models from those counts: a mean is a weighted sum, and Spearman is the weighted
Pearson correlation of mid-ranks that a cumulative sum over each array's fixed sort order gives
(exactly scipy.stats.spearmanr of the resampled arrays, ties averaged). No resample is sorted,
so 2,000 resamples of STS-B's 1,379 pairs, BCa's jackknife included, take about 0.3 s of CPU
(re-ranking every resample took over ten times as long). The jackknife is n leave-one-out
samples, so its cost grows as n²: SICK-R's 4,927 pairs take a few seconds.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields

import numpy as np
from scipy.stats import DegenerateDataWarning, bootstrap

from distributed_emb.evaluation.sts import spearman_x100

# Resamples per vectorised call: about this many counts at once, so SICK-R's 4,927 pairs
# (whose BCa jackknife alone is 4,927 × 4,926) stay within tens of MB.
_ELEMENTS_PER_BATCH = 4_000_000


@dataclass(frozen=True)
class PairedDifference:
    """candidate − baseline on the same items, with its bootstrap interval."""

    baseline: float
    candidate: float
    difference: float  # candidate - baseline
    low: float  # the `confidence` interval of the difference
    high: float
    n: int  # items (queries or pairs)
    n_resamples: int
    seed: int
    confidence: float
    method: str = "BCa"  # or "percentile", where BCa is degenerate

    def excludes_zero(self) -> bool:
        """True when the interval lies wholly on one side of 0: a difference, not noise."""
        return self.low > 0 or self.high < 0

    def format(self, digits: int = 2) -> str:
        """``+1.23 [+0.40, +2.05]``."""
        return f"{self.difference:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"

    def as_dict(self) -> dict:
        return {**asdict(self), "excludes_zero": self.excludes_zero()}

    @classmethod
    def from_dict(cls, values: Mapping) -> PairedDifference:
        """The inverse of :meth:`as_dict` (a results JSON read back)."""
        return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})


def paired_mean_difference(
    baseline_per_item: Sequence[float] | np.ndarray,
    candidate_per_item: Sequence[float] | np.ndarray,
    *,
    seed: int = 0,
    n_resamples: int = 2000,
    confidence: float = 0.95,
) -> PairedDifference:
    """Mean of `candidate_per_item` − mean of `baseline_per_item`, the items resampled.

    Each array holds one score per item, the same items in the same order (a retrieval
    set's per-query nDCG@10, say, × 100 as reported)."""
    baseline, candidate = _paired_arrays(
        {"baseline_per_item": baseline_per_item, "candidate_per_item": candidate_per_item}
    )
    per_item = candidate - baseline  # (n,)

    def mean_difference(counts: np.ndarray) -> np.ndarray:
        return counts @ per_item / counts.sum(axis=1)  # (B,)

    return _paired_interval(
        mean_difference,
        float(baseline.mean()),
        float(candidate.mean()),
        len(per_item),
        seed,
        n_resamples,
        confidence,
    )


def paired_spearman_difference(
    gold: Sequence[float] | np.ndarray,
    baseline_scores: Sequence[float] | np.ndarray,
    candidate_scores: Sequence[float] | np.ndarray,
    *,
    seed: int = 0,
    n_resamples: int = 2000,
    confidence: float = 0.95,
) -> PairedDifference:
    """Spearman × 100 of `candidate_scores` minus that of `baseline_scores`, both against
    `gold`; the pairs are resampled and both correlations recomputed on the same resample.

    Raises ValueError when an input's values are all equal (Spearman is undefined)."""
    gold_, baseline, candidate = _paired_arrays(
        {"gold": gold, "baseline_scores": baseline_scores, "candidate_scores": candidate_scores}
    )
    for name, values in (
        ("gold", gold_),
        ("baseline_scores", baseline),
        ("candidate_scores", candidate),
    ):
        if values.min() == values.max():
            raise ValueError(f"{name}: every value is {values[0]:g}; Spearman is undefined")
    return _paired_interval(
        _spearman_difference_of_counts(gold_, baseline, candidate),
        spearman_x100(baseline, gold_),
        spearman_x100(candidate, gold_),
        len(gold_),
        seed,
        n_resamples,
        confidence,
    )


def _spearman_difference_of_counts(
    gold: np.ndarray, baseline: np.ndarray, candidate: np.ndarray
) -> Callable[[np.ndarray], np.ndarray]:
    """The statistic of :func:`paired_spearman_difference`: (B, n) integer counts of each
    pair in B resamples → (B,) candidate's minus baseline's Spearman × 100 on each."""
    gold_order, baseline_order, candidate_order = (
        _SortOrder(a) for a in (gold, baseline, candidate)
    )

    def spearman_difference(counts: np.ndarray) -> np.ndarray:
        weights = counts.astype(np.float64)  # (B, n)
        total = weights.sum(axis=1)  # (B,)
        gold_ranks, gold_sum, gold_spread = _rank_moments(gold_order, counts, weights, total)

        def rho(order: _SortOrder) -> np.ndarray:  # Spearman × 100 of each resample: (B,)
            ranks, rank_sum, spread = _rank_moments(order, counts, weights, total)
            covariance = np.einsum("bn,bn->b", weights * ranks, gold_ranks)
            covariance -= rank_sum * gold_sum / total
            scale = np.sqrt(spread * gold_spread)
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.where(scale > 0, 100.0 * covariance / scale, 0.0)  # constant: 0

        return rho(candidate_order) - rho(baseline_order)

    return spearman_difference


class _SortOrder:
    """One array's sort order and tie groups, fixed once; the mid-ranks of any resample of it
    from the resample's counts."""

    def __init__(self, values: np.ndarray) -> None:
        self.order = np.argsort(values, kind="stable")  # (n,)
        ordered = values[self.order]
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])  # (G,) tie groups
        self.group_starts = starts
        group_of_sorted = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(values)]))
        self.group_of_item = np.empty_like(group_of_sorted)  # (n,) in the items' own order
        self.group_of_item[self.order] = group_of_sorted

    def doubled_mid_ranks(self, counts: np.ndarray) -> np.ndarray:
        """(B, n) integer counts of each item in B resamples → (B, n) twice the rank each
        item's copies take in its resample, ties (equal values, repeated draws) averaged.
        Doubled, a mid-rank is an integer, so it stays in the counts' integer type (half the
        memory traffic of float64). Items not drawn get a rank too; their zero count ignores
        it."""
        in_order = counts[:, self.order]  # (B, n)
        group_size = np.add.reduceat(in_order, self.group_starts, axis=1)  # (B, G)
        before = np.cumsum(group_size, axis=1) - group_size  # (B, G)
        return (2 * before + group_size + 1)[:, self.group_of_item]  # (B, n)


def _rank_moments(
    order: _SortOrder, counts: np.ndarray, weights: np.ndarray, total: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A resample's (doubled) mid-ranks, their weighted sum and their weighted sum of squared
    deviations, each item counted as often as it was drawn. Pearson's correlation of two
    arrays' mid-ranks so weighted is the resample's Spearman (doubling changes nothing)."""
    ranks = order.doubled_mid_ranks(counts).astype(np.float64)  # (B, n)
    weighted = weights * ranks  # (B, n)
    rank_sum = weighted.sum(axis=1)  # (B,)
    spread = np.einsum("bn,bn->b", weighted, ranks) - rank_sum * rank_sum / total  # (B,)
    # A resample where every drawn item ties has spread 0 up to rounding: no correlation.
    spread = np.where(spread > 1e-9 * rank_sum * rank_sum / total, spread, 0.0)
    return ranks, rank_sum, spread


def _paired_arrays(named: dict[str, Sequence[float] | np.ndarray]) -> list[np.ndarray]:
    """Each input as a finite 1-D float array, all of one length ≥ 2; else ValueError naming
    the input."""
    arrays = []
    for name, values in named.items():
        array = np.asarray(values, dtype=np.float64)
        if array.ndim != 1:
            raise ValueError(f"{name}: expected one score per item (1-D), got shape {array.shape}")
        if not np.isfinite(array).all():
            raise ValueError(f"{name}: holds NaN or infinite values")
        arrays.append(array)
    lengths = {name: len(a) for name, a in zip(named, arrays, strict=True)}
    if len(set(lengths.values())) > 1:
        given = ", ".join(f"{name} {length}" for name, length in lengths.items())
        raise ValueError(
            f"paired scores need the same items in each input; lengths differ: {given}"
        )
    if arrays[0].shape[0] < 2:
        raise ValueError(f"a paired bootstrap needs at least 2 items, got {arrays[0].shape[0]}")
    return arrays


def _paired_interval(
    statistic_of_counts: Callable[[np.ndarray], np.ndarray],
    baseline: float,
    candidate: float,
    n: int,
    seed: int,
    n_resamples: int,
    confidence: float,
) -> PairedDifference:
    """The BCa interval (percentile where BCa is degenerate) of `statistic_of_counts` over
    resamples of the n items; see the module docstring."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")

    def statistic(indices: np.ndarray, axis: int = -1) -> np.ndarray:
        # indices: (..., m) items drawn (m = n for a resample, n − 1 for a jackknife sample)
        rows = indices.reshape(-1, indices.shape[-1])  # (B, m)
        offsets = (np.arange(len(rows)) * n)[:, None]
        counts = np.bincount((rows + offsets).ravel(), minlength=len(rows) * n)
        values = statistic_of_counts(counts.reshape(len(rows), n).astype(np.int32))  # (B,)
        return values.reshape(indices.shape[:-1])

    options = dict(
        vectorized=True,
        axis=-1,
        confidence_level=confidence,
        batch=max(1, _ELEMENTS_PER_BATCH // n),
    )
    items = (np.arange(n),)
    method = "BCa"
    with warnings.catch_warnings():
        # BCa's jackknife divides by the spread of the leave-one-out statistics: 0 for
        # identical models, a NaN interval, and scipy's and numpy's warnings about it.
        warnings.simplefilter("ignore", DegenerateDataWarning)
        with np.errstate(invalid="ignore", divide="ignore"):
            result = bootstrap(
                items,
                statistic,
                n_resamples=n_resamples,
                method="BCa",
                rng=np.random.default_rng(seed),
                **options,
            )
    low, high = result.confidence_interval
    if not (np.isfinite(low) and np.isfinite(high)):
        method = "percentile"  # the same resamples, none drawn anew
        result = bootstrap(
            items,
            statistic,
            n_resamples=0,
            method="percentile",
            bootstrap_result=result,
            rng=np.random.default_rng(seed),
            **options,
        )
        low, high = result.confidence_interval
    return PairedDifference(
        baseline=float(baseline),
        candidate=float(candidate),
        difference=float(candidate - baseline),
        low=float(low),
        high=float(high),
        n=int(n),
        n_resamples=int(n_resamples),
        seed=int(seed),
        confidence=float(confidence),
        method=method,
    )
