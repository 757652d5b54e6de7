"""Top-k search over an embedding output's shards: each shard's index (or, with `exact=True`,
a brute-force scan of its vectors) answers the queries, and a running top-k merges the
answers shard by shard, so no process holds more than one shard's index or vectors.

A hit is a key, (shard number << 40) | row, until the end: the ids (and texts) of the final
top-k are then read from the shards that hold them. Scores are inner products of unit
vectors (cosine similarities; a binary row counts as its ±1 vector, shard_layout.sign_vectors);
queries are normalised here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from distributed_emb.vectors.ann_index import (
    load_shard_index,
    read_index_info,
    search_index,
)
from distributed_emb.vectors.shard_layout import (
    EMBEDDING,
    ID,
    TEXT,
    Manifest,
    normalize_rows,
    read_calibration,
    read_shard,
    unit_vectors,
)

ROW_BITS = 40  # rows per shard < 2**40
# Scores of at most this many query × row pairs at once in an exact scan (64 MiB of float32).
EXACT_BLOCK = 16 * 1024 * 1024


def shard_keys(number: int, rows: np.ndarray) -> np.ndarray:
    """Keys of `rows` (any shape, −1 for none) of shard `number`; −1 stays −1."""
    rows = np.asarray(rows, dtype=np.int64)
    return np.where(rows < 0, -1, (np.int64(number) << ROW_BITS) | rows)


def split_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(shard numbers, rows) of `keys`; both −1 where the key is −1."""
    keys = np.asarray(keys, dtype=np.int64)
    missing = keys < 0
    numbers = np.where(missing, -1, keys >> ROW_BITS)
    rows = np.where(missing, -1, keys & ((1 << ROW_BITS) - 1))
    return numbers, rows


class RunningTopK:
    """The k best (score, key) of each query over the shards seen so far: (q, k) arrays, −inf
    and −1 where fewer than k were seen. Equal scores keep the earlier shard's hit first, so
    the order does not depend on how the corpus was cut into shards."""

    def __init__(self, queries: int, k: int) -> None:
        self.scores = np.full((queries, k), -np.inf, dtype=np.float32)
        self.keys = np.full((queries, k), -1, dtype=np.int64)

    def add(self, scores: np.ndarray, keys: np.ndarray) -> None:
        """One shard's (q, m) answers, best first per row or not."""
        k = self.scores.shape[1]
        merged_scores = np.concatenate([self.scores, scores.astype(np.float32)], axis=1)
        merged_keys = np.concatenate([self.keys, keys], axis=1)  # (q, k + m)
        order = np.argsort(-merged_scores, axis=1, kind="stable")[:, :k]
        self.scores = np.take_along_axis(merged_scores, order, axis=1)
        self.keys = np.take_along_axis(merged_keys, order, axis=1)


def exact_top_k(vectors: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores (q, k), rows (q, k)) of the k largest inner products of each query with the
    (n, d) `vectors`, best first, equal scores in row order (which rows of a tie at the k-th
    place are kept is argpartition's choice); −inf / −1 past n."""
    q, n = len(queries), len(vectors)
    scores_out = np.full((q, k), -np.inf, dtype=np.float32)
    rows_out = np.full((q, k), -1, dtype=np.int64)
    take = min(k, n)
    if take == 0 or q == 0:
        return scores_out, rows_out
    step = max(1, EXACT_BLOCK // max(n, 1))
    for start in range(0, q, step):
        block = queries[start : start + step] @ vectors.T  # (b, n)
        if take < n:
            candidates = np.argpartition(-block, take - 1, axis=1)[:, :take]  # (b, take)
        else:
            candidates = np.broadcast_to(np.arange(n), block.shape)
        chosen = np.take_along_axis(block, candidates, axis=1)
        # Best first, then the lower row: lexsort's last key is the primary one.
        order = np.lexsort((candidates, -chosen), axis=1)
        scores_out[start : start + step, :take] = np.take_along_axis(chosen, order, axis=1)
        rows_out[start : start + step, :take] = np.take_along_axis(candidates, order, axis=1)
    return scores_out, rows_out


def search_keys(
    manifest: Manifest,
    queries: np.ndarray,
    k: int,
    exact: bool = False,
    ef_search: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(scores (q, k), keys (q, k)) of the k best rows of the whole output for each of the
    (q, d) `queries` (normalised here). One shard's index (or vectors, `exact`) at a time."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    queries = normalize_rows(np.atleast_2d(queries))  # (q, d)
    if queries.shape[1] != manifest.dim:
        raise ValueError(
            f"queries have {queries.shape[1]} dimensions, the embeddings {manifest.dim} "
            f"({manifest.path}): embed the queries with the manifest's model"
        )
    best = RunningTopK(len(queries), k)
    if exact:
        ranges = read_calibration(manifest) if manifest.dtype == "int8" else None
        for number in range(len(manifest.shards)):
            shard = read_shard(manifest, number, (ID, EMBEDDING))
            scores, rows = exact_top_k(unit_vectors(shard, manifest, ranges), queries, k)
            best.add(scores, shard_keys(number, rows))
    else:
        info = read_index_info(manifest)
        for number in range(len(manifest.shards)):
            index = load_shard_index(info, number)
            scores, rows = search_index(index, queries, k, ef_search)
            del index  # before the next shard's is read
            best.add(scores, shard_keys(number, rows))
    return best.scores, best.keys


def lookup_columns(
    manifest: Manifest, keys: np.ndarray, columns: Sequence[str]
) -> dict[str, np.ndarray]:
    """The values of `columns` (id, text, document) for each key, in `keys`' shape: ids −1,
    texts None and documents −1 where the key is −1 (or the shard lacks the column). Reads
    only the shards that hold a key, one at a time."""
    numbers, rows = split_keys(keys)
    filled = {
        name: np.full(keys.shape, None, dtype=object)
        if name == TEXT
        else np.full(keys.shape, -1, dtype=np.int64)
        for name in columns
    }
    for number in np.unique(numbers[numbers >= 0]):
        shard = read_shard(manifest, int(number), [c for c in columns if c != EMBEDDING])
        here = numbers == number
        for name in columns:
            values = getattr(shard, "ids" if name == ID else name)
            if values is not None:
                filled[name][here] = values[rows[here]]
    return filled


@dataclass
class SearchResult:
    """Per query, the k best rows, best first: `ids` (q, k) int64 and `scores` (q, k) float32
    cosine similarities, −1 / −inf past the corpus's end; `texts` (q, k) (None where absent)
    when asked for."""

    ids: np.ndarray
    scores: np.ndarray
    texts: np.ndarray | None = None


def search(
    manifest: Manifest,
    queries: np.ndarray,
    k: int = 10,
    exact: bool = False,
    ef_search: int | None = None,
    with_text: bool = False,
) -> SearchResult:
    """The k best rows across every shard for each of the (q, d) query vectors: by each
    shard's index, or by a brute-force scan with `exact=True` (the reference)."""
    scores, keys = search_keys(manifest, queries, k, exact=exact, ef_search=ef_search)
    found = lookup_columns(manifest, keys, [ID, TEXT] if with_text else [ID])
    return SearchResult(ids=found[ID], scores=scores, texts=found.get(TEXT))


def recall_at_k(approximate: np.ndarray, exact: np.ndarray, k: int | None = None) -> float:
    """Mean over queries of |approximate top-k ∩ exact top-k| / |exact top-k|: the share of
    the true k nearest rows the index found (ids; −1 entries are not rows)."""
    approximate, exact = np.atleast_2d(approximate), np.atleast_2d(exact)
    if approximate.shape[0] != exact.shape[0]:
        raise ValueError(f"{approximate.shape[0]} approximate rows, {exact.shape[0]} exact")
    k = k or exact.shape[1]
    shares = []
    for found, truth in zip(approximate[:, :k], exact[:, :k], strict=True):
        truth = set(truth[truth >= 0].tolist())
        if truth:
            shares.append(len(truth & set(found.tolist())) / len(truth))
    if not shares:
        raise ValueError("no exact neighbours to measure recall against")
    return float(np.mean(shares))


def sample_rows(manifest: Manifest, count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(ids (m,), unit vectors (m, d)) of up to `count` corpus rows drawn without replacement,
    reading only the shards they are in."""
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(manifest.rows, size=min(count, manifest.rows), replace=False))
    ends = np.cumsum([entry.rows for entry in manifest.shards])  # (S,)
    numbers = np.searchsorted(ends, chosen, side="right")
    ranges = read_calibration(manifest) if manifest.dtype == "int8" else None
    ids, vectors = [], []
    for number in np.unique(numbers):
        start = ends[number] - manifest.shards[number].rows
        shard = read_shard(manifest, int(number), (ID, EMBEDDING))
        rows = chosen[numbers == number] - start
        ids.append(shard.ids[rows])
        vectors.append(unit_vectors(shard, manifest, ranges)[rows])
    if not ids:
        return np.zeros(0, dtype=np.int64), np.zeros((0, manifest.dim), dtype=np.float32)
    return np.concatenate(ids), np.concatenate(vectors)


def index_recall(
    manifest: Manifest,
    sample: int = 1000,
    k: int = 10,
    seed: int = 0,
    ef_search: int | None = None,
) -> float:
    """recall@k of the index against exact search, with `sample` corpus rows as queries. Each
    query's own row is left out of both lists (it would be a free hit), so what is measured
    is how many of its k nearest other rows the index finds."""
    ids, queries = sample_rows(manifest, sample, seed)
    approximate = search(manifest, queries, k + 1, ef_search=ef_search).ids
    exact = search(manifest, queries, k + 1, exact=True).ids
    return recall_at_k(without_own_row(approximate, ids, k), without_own_row(exact, ids, k), k)


def without_own_row(found: np.ndarray, own: np.ndarray, k: int) -> np.ndarray:
    """Each row of `found` (q, k + 1) without its query's own id, cut to k."""
    kept = np.full((len(found), k), -1, dtype=np.int64)
    for i, (row, me) in enumerate(zip(found, own, strict=True)):
        others = row[row != me][:k]
        kept[i, : len(others)] = others
    return kept
