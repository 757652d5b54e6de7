"""Intra-document clustering (IDC): which sentences of one document are each other's positives.

For a document with normalised sentence embeddings E (n×d):

1. W = EEᵀ with the diagonal removed (a sentence is not its own neighbour).
2. Keep the edge (i, j) if j ∈ topK(i) **or** i ∈ topK(j): the symmetrised K-nearest-neighbour
   graph, the rule in DESIGN.md. (``mutual=True`` keeps only edges where both hold — the
   stricter "mutual kNN" graph, which can leave sentences alone in their own cluster.)
   K ≥ n − 1 makes every sentence a neighbour of every other: the complete graph.
3. Connected components of that graph are the clusters.
4. Positives are all unordered pairs (i < j) inside each cluster; ``max_pairs_per_cluster``
   caps a cluster's pairs by sampling without replacement, seeded, so the same seed gives
   the same pairs on any machine.

Determinism, since the annotation actors and the single-process reference must agree:

- Ties in similarity go to the lowest sentence index (a stable sort of −W).
- Clusters are numbered by their lowest sentence index (cluster 0 holds sentence 0).
- Pairs are listed cluster by cluster, then in row-major (i, j) order; sampled pairs keep that
  order. Each cluster samples with its own generator seeded by ``(seed, cluster_id)``, so one
  cluster's cap never changes another cluster's pairs.

With K = 1 and the union rule every sentence has at least one edge, so a document with
n ≥ 2 sentences has no singleton clusters; a document with one sentence gives no pairs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import numpy as np
from pydantic import Field
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from distributed_emb.settings import Seed, section


@section
class IDCConfig:
    """Knobs of intra-document clustering (a section of the InfoCSE config)."""

    top_k: Annotated[
        int,
        Field(
            ge=1,
            description="a sentence's nearest neighbours (by cosine) linked to it in its "
            "document's graph; at least the document's length - 1: one cluster per document",
        ),
    ] = 1
    # False is the rule in DESIGN.md.
    mutual: Annotated[
        bool,
        Field(
            description="false: link i and j when j is among i's top_k or i among j's; true: "
            "only when both hold (mutual kNN; can leave sentences alone)"
        ),
    ] = False
    max_pairs_per_cluster: Annotated[
        int | None,
        Field(
            ge=1,
            description="at most this many positive pairs per cluster, sampled with the seed; "
            "null: every pair of every cluster",
        ),
    ] = None
    # The annotator derives each document's seed from this one and the document's id.
    seed: Annotated[Seed, Field(description="seed of the pair sampling of capped clusters")] = 0


@dataclass
class IDCResult:
    """Clusters and positive pairs of one document (indices into its sentences)."""

    labels: np.ndarray  # (n,) int64 cluster id of each sentence, numbered by lowest member
    pairs: np.ndarray  # (P, 2) int64 sentence indices (i, j) with i < j
    pair_clusters: np.ndarray  # (P,) int64 cluster id of each pair
    capped_clusters: int  # how many clusters had more pairs than the cap

    @property
    def num_clusters(self) -> int:
        return int(self.labels.max()) + 1 if len(self.labels) else 0

    @property
    def clusters(self) -> list[list[int]]:
        """Sentence indices of each cluster, ascending, in cluster-id order."""
        return [np.flatnonzero(self.labels == c).tolist() for c in range(self.num_clusters)]


def _check_square(similarity: np.ndarray) -> np.ndarray:
    similarity = np.asarray(similarity, dtype=np.float64)
    if similarity.ndim != 2 or similarity.shape[0] != similarity.shape[1]:
        raise ValueError(f"similarity must be a square (n, n) matrix, got {similarity.shape}")
    if not np.all(np.isfinite(similarity)):
        raise ValueError("similarity holds NaN or infinite values")
    return similarity


def neighbour_graph(similarity: np.ndarray, top_k: int, mutual: bool = False) -> np.ndarray:
    """Boolean (n, n) adjacency of the (symmetrised or mutual) top-K graph; diagonal False."""
    similarity = _check_square(similarity)
    if top_k < 1:
        raise ValueError(f"top_k must be ≥ 1, got {top_k}")
    n = similarity.shape[0]
    adjacency = np.zeros((n, n), dtype=bool)
    if n < 2:
        return adjacency
    k = min(top_k, n - 1)
    scores = similarity.copy()
    np.fill_diagonal(scores, -np.inf)  # W without the diagonal
    # A stable sort of −W: among equal similarities the lowest index comes first.
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]  # (n, k)
    chosen = np.zeros((n, n), dtype=bool)  # chosen[i, j]: j ∈ topK(i)
    chosen[np.arange(n)[:, None], order] = True
    adjacency = (chosen & chosen.T) if mutual else (chosen | chosen.T)
    np.fill_diagonal(adjacency, False)
    return adjacency


def _labels_by_lowest_member(raw_labels: np.ndarray) -> np.ndarray:
    """Renumber component labels so cluster ids follow each cluster's lowest sentence index."""
    _, first_seen, inverse = np.unique(raw_labels, return_index=True, return_inverse=True)
    new_id = np.empty(len(first_seen), dtype=np.int64)
    new_id[np.argsort(first_seen)] = np.arange(len(first_seen))
    return new_id[inverse]


def _unrank_pairs(m: int, ranks: np.ndarray) -> np.ndarray:
    """Row-major ranks of the pairs (i < j) among m items → (len(ranks), 2) index pairs.

    Exact integer arithmetic (no square roots), O(m) memory: the pairs of a large cluster are
    sampled without ever listing all m(m−1)/2 of them.
    """
    rows = np.arange(m, dtype=np.int64)
    row_start = rows * m - rows * (rows + 1) // 2  # rank of (i, i+1)
    i = np.searchsorted(row_start, ranks, side="right") - 1
    j = ranks - row_start[i] + i + 1
    return np.stack([i, j], axis=1)


def _cluster_pairs(
    members: np.ndarray, cap: int | None, seed: int, cluster_id: int
) -> tuple[np.ndarray, bool]:
    """All (or a seeded sample of `cap`) unordered pairs of `members` (ascending indices)."""
    m = len(members)
    total = m * (m - 1) // 2
    if total == 0:
        return np.zeros((0, 2), dtype=np.int64), False
    if cap is None or total <= cap:
        i, j = np.triu_indices(m, k=1)  # row-major order
        local = np.stack([i, j], axis=1)
        capped = False
    else:
        rng = np.random.default_rng([seed, cluster_id])
        ranks = np.sort(rng.choice(total, size=cap, replace=False))
        local = _unrank_pairs(m, ranks.astype(np.int64))
        capped = True
    return members[local].astype(np.int64), capped


def cluster_by_similarity(
    similarity: np.ndarray,
    top_k: int = 1,
    mutual: bool = False,
    max_pairs_per_cluster: int | None = None,
    seed: int = 0,
) -> IDCResult:
    """IDC on a precomputed (n, n) similarity matrix (the diagonal is ignored)."""
    if max_pairs_per_cluster is not None and max_pairs_per_cluster < 1:
        raise ValueError(f"max_pairs_per_cluster must be ≥ 1 or None, got {max_pairs_per_cluster}")
    adjacency = neighbour_graph(similarity, top_k, mutual)
    n = adjacency.shape[0]
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return IDCResult(empty, np.zeros((0, 2), dtype=np.int64), empty, 0)
    rows, cols = np.nonzero(adjacency)
    graph = coo_matrix((np.ones(len(rows)), (rows, cols)), shape=(n, n))
    _, raw_labels = connected_components(graph, directed=False)
    labels = _labels_by_lowest_member(raw_labels).astype(np.int64)  # (n,)

    pair_blocks, cluster_blocks, capped_clusters = [], [], 0
    for cluster_id in range(int(labels.max()) + 1):
        members = np.flatnonzero(labels == cluster_id)
        pairs, capped = _cluster_pairs(members, max_pairs_per_cluster, seed, cluster_id)
        pair_blocks.append(pairs)
        cluster_blocks.append(np.full(len(pairs), cluster_id, dtype=np.int64))
        capped_clusters += int(capped)
    return IDCResult(
        labels=labels,
        pairs=np.concatenate(pair_blocks),  # (P, 2)
        pair_clusters=np.concatenate(cluster_blocks),  # (P,)
        capped_clusters=capped_clusters,
    )


def intra_document_clusters(
    embeddings: np.ndarray, config: IDCConfig | None = None, seed: int | None = None
) -> IDCResult:
    """IDC on one document's sentence embeddings (n, d); rows are L2-normalised here.

    `seed` overrides ``config.seed`` (the annotator derives one per document from its id, so a
    document's sampled pairs do not depend on which batch or actor it landed in).
    """
    config = config or IDCConfig()
    embeddings = np.asarray(embeddings, dtype=np.float64)
    if embeddings.ndim != 2:
        raise ValueError(f"embeddings must be (n, d), got shape {embeddings.shape}")
    norms = np.linalg.norm(embeddings, axis=1, keepdims=True)  # (n, 1)
    if np.any(norms == 0):
        raise ValueError("an embedding is the zero vector; its cosine similarity is undefined")
    normalised = embeddings / norms  # (n, d)
    similarity = normalised @ normalised.T  # (n, n) cosine similarity
    return cluster_by_similarity(
        similarity,
        top_k=config.top_k,
        mutual=config.mutual,
        max_pairs_per_cluster=config.max_pairs_per_cluster,
        seed=config.seed if seed is None else seed,
    )
