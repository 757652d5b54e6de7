"""IDC on hand-made similarity matrices, and against a brute-force union-find reference."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from distributed_emb.checks import ConfigError
from distributed_emb.infocse.idc import (
    IDCConfig,
    _unrank_pairs,
    cluster_by_similarity,
    intra_document_clusters,
    neighbour_graph,
)
from distributed_emb.settings import build


def symmetric(n: int, entries: dict[tuple[int, int], float], background: float = 0.0):
    """An (n, n) similarity matrix with `background` off the listed (i, j) entries."""
    s = np.full((n, n), background)
    for (i, j), value in entries.items():
        s[i, j] = s[j, i] = value
    np.fill_diagonal(s, 1.0)
    return s


def reference_idc(similarity: np.ndarray, top_k: int, mutual: bool = False):
    """Plain loops: neighbours by (−similarity, index), union-find, all pairs per cluster."""
    n = len(similarity)
    top = []
    for i in range(n):
        others = sorted((j for j in range(n) if j != i), key=lambda j: (-similarity[i, j], j))
        top.append(set(others[:top_k]))
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x

    for i, j in itertools.combinations(range(n), 2):
        keep = (j in top[i] and i in top[j]) if mutual else (j in top[i] or i in top[j])
        if keep:
            parent[find(i)] = find(j)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(i)
    clusters = sorted(groups.values(), key=min)
    pairs = [p for members in clusters for p in itertools.combinations(members, 2)]
    return clusters, pairs


def test_k1_two_clusters():
    # 0↔2 are each other's nearest; 1↔3 likewise; 4's nearest is 3, so 4 joins {1, 3}.
    s = symmetric(5, {(0, 2): 0.9, (1, 3): 0.8, (3, 4): 0.6, (0, 4): 0.3, (1, 2): 0.2})
    result = cluster_by_similarity(s, top_k=1)
    assert result.labels.tolist() == [0, 1, 0, 1, 1]
    assert result.clusters == [[0, 2], [1, 3, 4]]
    assert result.pairs.tolist() == [[0, 2], [1, 3], [1, 4], [3, 4]]
    assert result.pair_clusters.tolist() == [0, 1, 1, 1]
    assert result.capped_clusters == 0


def test_k2_merges_clusters_k1_keeps_apart():
    # Two tight pairs {0,1} and {2,3}; the second neighbour of 1 is 2, which bridges them at K=2.
    s = symmetric(4, {(0, 1): 0.9, (2, 3): 0.9, (1, 2): 0.5, (0, 3): 0.1, (0, 2): 0.05})
    assert cluster_by_similarity(s, top_k=1).clusters == [[0, 1], [2, 3]]
    k2 = cluster_by_similarity(s, top_k=2)
    assert k2.clusters == [[0, 1, 2, 3]]
    assert k2.pairs.tolist() == [list(p) for p in itertools.combinations(range(4), 2)]


def test_union_rule_vs_mutual_rule():
    # 2's nearest is 1, but 1's nearest is 0: the union rule links 2, the mutual rule does not.
    s = symmetric(3, {(0, 1): 0.9, (1, 2): 0.5, (0, 2): 0.1})
    assert cluster_by_similarity(s, top_k=1).clusters == [[0, 1, 2]]
    mutual = cluster_by_similarity(s, top_k=1, mutual=True)
    assert mutual.clusters == [[0, 1], [2]]
    assert mutual.pairs.tolist() == [[0, 1]]


def test_ties_go_to_lowest_index():
    # 3 is equally close to 0 and 2 (0.6); the tie goes to 0, so 3 joins {0, 1}, not {2, 4}.
    s = symmetric(5, {(0, 1): 0.9, (2, 4): 0.9, (3, 0): 0.6, (3, 2): 0.6}, background=0.1)
    assert cluster_by_similarity(s, top_k=1).clusters == [[0, 1, 3], [2, 4]]
    # Swap sentences 0 and 2: now index 0 belongs to the other cluster and wins the tie.
    perm = [2, 1, 0, 3, 4]
    swapped = s[np.ix_(perm, perm)]
    assert cluster_by_similarity(swapped, top_k=1).clusters == [[0, 3, 4], [1, 2]]


def test_all_equal_similarities_form_one_star():
    # Every row ties everywhere: each sentence picks the lowest other index, so all link to 0/1.
    s = np.full((4, 4), 0.5)
    graph = neighbour_graph(s, top_k=1)
    assert graph[1:, 0].all() and graph[0, 1]
    assert cluster_by_similarity(s, top_k=1).clusters == [[0, 1, 2, 3]]


def test_one_two_and_zero_sentence_documents():
    one = cluster_by_similarity(np.ones((1, 1)), top_k=1)
    assert one.labels.tolist() == [0] and one.pairs.shape == (0, 2) and one.num_clusters == 1
    two = cluster_by_similarity(symmetric(2, {(0, 1): -0.3}), top_k=1)
    assert two.clusters == [[0, 1]] and two.pairs.tolist() == [[0, 1]]
    none = cluster_by_similarity(np.zeros((0, 0)), top_k=1)
    assert none.num_clusters == 0 and none.pairs.shape == (0, 2)


def test_k_at_least_n_minus_1_is_complete_graph():
    rng = np.random.default_rng(3)
    e = rng.normal(size=(6, 4))
    s = e @ e.T
    for k in (5, 6, 50):
        assert neighbour_graph(s, top_k=k).sum() == 6 * 5
        assert cluster_by_similarity(s, top_k=k).clusters == [list(range(6))]


@pytest.mark.parametrize("mutual", [False, True])
@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_matches_bruteforce_reference_on_random_matrices(top_k, mutual):
    rng = np.random.default_rng(top_k * 10 + mutual)
    for trial in range(40):
        n = int(rng.integers(1, 12))
        # Rounded to one decimal so ties are frequent.
        raw = np.round(rng.uniform(-1, 1, size=(n, n)), 1)
        s = np.triu(raw, 1)
        s = s + s.T
        clusters, pairs = reference_idc(s, top_k, mutual)
        result = cluster_by_similarity(s, top_k=top_k, mutual=mutual)
        assert result.clusters == clusters, (trial, s)
        assert [tuple(p) for p in result.pairs.tolist()] == pairs, (trial, s)


def test_cap_samples_deterministically_within_cluster():
    s = np.full((9, 9), 0.1)
    s[:6, :6] = 0.9  # cluster {0..5}: 15 pairs
    s[6:, 6:] = 0.8  # cluster {6, 7, 8}: 3 pairs
    full = cluster_by_similarity(s, top_k=1)
    assert full.clusters == [[0, 1, 2, 3, 4, 5], [6, 7, 8]]
    assert len(full.pairs) == 18

    capped = cluster_by_similarity(s, top_k=1, max_pairs_per_cluster=4, seed=7)
    assert capped.capped_clusters == 1
    big = capped.pairs[capped.pair_clusters == 0]
    small = capped.pairs[capped.pair_clusters == 1]
    assert len(big) == 4 and len({tuple(p) for p in big.tolist()}) == 4
    all_big = {tuple(p) for p in full.pairs[full.pair_clusters == 0].tolist()}
    assert {tuple(p) for p in big.tolist()} <= all_big
    assert big.tolist() == sorted(big.tolist())  # sampled pairs keep row-major order
    assert small.tolist() == [[6, 7], [6, 8], [7, 8]]  # under the cap: untouched

    again = cluster_by_similarity(s, top_k=1, max_pairs_per_cluster=4, seed=7)
    assert np.array_equal(again.pairs, capped.pairs)
    samples = {
        tuple(map(tuple, cluster_by_similarity(s, 1, max_pairs_per_cluster=4, seed=k).pairs))
        for k in range(10)
    }
    assert len(samples) > 1  # the seed matters


def test_unrank_pairs_matches_row_major_listing():
    for m in (2, 3, 7, 20):
        total = m * (m - 1) // 2
        expected = np.stack(np.triu_indices(m, k=1), axis=1)
        assert np.array_equal(_unrank_pairs(m, np.arange(total)), expected)


def test_embeddings_are_normalised_before_similarity():
    # Scaling a row changes its dot products but not its cosines: clusters must not change.
    rng = np.random.default_rng(0)
    e = rng.normal(size=(8, 5))
    scaled = e * rng.uniform(0.1, 10.0, size=(8, 1))
    a = intra_document_clusters(e, IDCConfig(top_k=1))
    b = intra_document_clusters(scaled, IDCConfig(top_k=1))
    assert a.clusters == b.clusters
    unit = e / np.linalg.norm(e, axis=1, keepdims=True)
    assert a.clusters == cluster_by_similarity(unit @ unit.T, top_k=1).clusters


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="square"):
        cluster_by_similarity(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="NaN"):
        cluster_by_similarity(np.array([[1.0, np.nan], [np.nan, 1.0]]))
    with pytest.raises(ValueError, match="top_k"):
        cluster_by_similarity(np.eye(3), top_k=0)
    with pytest.raises(ValueError, match="max_pairs_per_cluster"):
        cluster_by_similarity(np.eye(3), max_pairs_per_cluster=0)
    # The section's ranges are its declarations (distributed_emb/settings.py).
    with pytest.raises(ConfigError, match=r"^top_k: must be >= 1, got 0 — a sentence's"):
        build(IDCConfig, {"top_k": 0})
    with pytest.raises(ConfigError, match=r"^max_pairs_per_cluster: must be >= 1 or null, got 0"):
        build(IDCConfig, {"max_pairs_per_cluster": 0})
    with pytest.raises(ConfigError, match=r"^seed: must be in \[0, 4294967295\], got -1"):
        build(IDCConfig, {"seed": -1})
    with pytest.raises(ValueError, match="zero vector"):
        intra_document_clusters(np.array([[1.0, 0.0], [0.0, 0.0]]))
