"""Semantic textual similarity: cosine of the two sentences' embeddings, Spearman × 100.

This is the one STS implementation: the evaluator's STS12–16 / STS-B / SICK-R numbers and the
in-training STS-B dev metric both go through :func:`spearman_of_embeddings`; every STS-B score
of a model (in-training dev, an InfoCSE round's dev, the test of an export or of a search's
best model) is :func:`stsb_score`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# The STS-B reader and the pair scores live below model/ and evaluation/ (the serving check of
# an export reads them too); imported here under their old names.
from distributed_emb.data.senteval_files import read_stsb as read_stsb
from distributed_emb.evaluation.senteval_data import StsData
from distributed_emb.scoring import pair_cosines as pair_cosines
from distributed_emb.scoring import spearman_of_embeddings as spearman_of_embeddings
from distributed_emb.scoring import spearman_x100 as spearman_x100

Encoder = Callable[[list[str]], np.ndarray]


def encode_pairs(encode: Encoder, data: StsData) -> tuple[np.ndarray, np.ndarray]:
    """Embed both sides of `data` in one `encode` call (one pass for a Ray pipeline)."""
    n = len(data)
    embeddings = np.asarray(encode(list(data.sentences1) + list(data.sentences2)))  # (2n, d)
    if embeddings.ndim != 2 or embeddings.shape[0] != 2 * n:
        raise ValueError(
            f"encode returned shape {embeddings.shape} for {2 * n} sentences; expected (2n, d)"
        )
    return embeddings[:n], embeddings[n:]


def sts_cosines(encode: Encoder, data: StsData) -> np.ndarray:
    """The model's prediction for each pair of `data`: the cosine of its two sentences, (n,).

    `encode` maps a list of sentences to an (n, d) array in the same order.
    """
    return pair_cosines(*encode_pairs(encode, data))


def sts_spearman(encode: Encoder, data: StsData) -> float:
    """Spearman × 100 of cosine similarity against the gold scores of `data`."""
    return spearman_x100(sts_cosines(encode, data), data.scores)


def per_pair(cosines: np.ndarray, gold_scores: np.ndarray) -> dict[str, list[float]]:
    """What a paired comparison of two models on an STS set needs (evaluation/comparison.py):
    each pair's cosine and gold score, in the set's order, as JSON-ready lists."""
    return {
        "cosine": np.asarray(cosines, dtype=np.float64).tolist(),
        "gold": np.asarray(gold_scores, dtype=np.float64).tolist(),
    }


def stsb_score(
    encode: Encoder, split: str, senteval_dir: str | None = None, max_pairs: int | None = None
) -> float:
    """STS-B `split` Spearman × 100 of `encode` (see :func:`read_stsb`). Raises
    SentEvalDataError when the split is missing."""
    return sts_spearman(encode, read_stsb(split, senteval_dir, max_pairs))


def aggregate_subsets(
    names: list[str], system_scores: list[np.ndarray], gold_scores: list[np.ndarray]
) -> dict:
    """STS12–16 summary over subsets, in the three ways SentEval/SimCSE report it.

    - ``all``: Spearman of all subsets' pairs concatenated (pooled) — SimCSE's tables;
    - ``mean``: plain mean of the subsets' Spearman (SentEval's "ALL (average)");
    - ``wmean``: mean weighted by subset size (SentEval's "ALL (weighted average)").
    All × 100, plus per-subset Spearman and sizes.
    """
    if not (len(names) == len(system_scores) == len(gold_scores)) or not names:
        raise ValueError("need one name, system-score and gold-score array per subset")
    per_subset = {
        name: {"spearman": spearman_x100(system, gold), "n": len(gold)}
        for name, system, gold in zip(names, system_scores, gold_scores, strict=True)
    }
    spearmans = np.array([r["spearman"] for r in per_subset.values()])
    sizes = np.array([r["n"] for r in per_subset.values()])
    return {
        "all": spearman_x100(np.concatenate(system_scores), np.concatenate(gold_scores)),
        "mean": float(spearmans.mean()),
        "wmean": float(np.average(spearmans, weights=sizes)),
        "n": int(sizes.sum()),
        "subsets": per_subset,
    }


def sts_subsets_spearman(encode: Encoder, subsets: list[StsData]) -> dict:
    """Encode every subset (one `encode` call) and aggregate (see :func:`aggregate_subsets`);
    ``per_pair`` holds every subset's pairs, pooled in subset order."""
    merged = StsData(
        [s for d in subsets for s in d.sentences1],
        [s for d in subsets for s in d.sentences2],
        np.concatenate([d.scores for d in subsets]),
        "merged",
    )
    embeddings1, embeddings2 = encode_pairs(encode, merged)  # (N, d) each
    cosines = pair_cosines(embeddings1, embeddings2)  # (N,)
    bounds = np.cumsum([len(d) for d in subsets])[:-1]
    result = aggregate_subsets(
        [d.name.split("/")[-1] for d in subsets],
        np.split(cosines, bounds),
        [d.scores for d in subsets],
    )
    for data in subsets:
        result["subsets"][data.name.split("/")[-1]]["n_unscored"] = data.n_unscored
    result["per_pair"] = per_pair(cosines, merged.scores)  # pooled, as "all"
    return result
