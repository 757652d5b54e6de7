"""Hard-negative mining over embedding outputs, in the vocabulary and order of operations of
sentence-transformers' `mine_hard_negatives` (range_min, range_max, max_score, min_score,
relative_margin, absolute_margin, num_negatives, sampling_strategy "top" or "random"), for two
kinds of input:

- **pairs** (`anchors` set): a labelled (anchor, positive) table, embedded by the embed job as
  two outputs of the same rows: its anchor column (`anchors`, data.text_column=anchor) and its
  positive column (`embeddings`, data.text_column=positive, with the index). A row's anchor and
  positive share its id. Every positive is a candidate of every anchor, as the positives are
  sentence-transformers' corpus, and each margin is measured against the anchor's positive's
  score, anchor · positive (its query and document embeddings: the two outputs).
- **unlabelled** (`anchors` null): every row of `embeddings` is an anchor and a candidate. Its
  only positive is its own second view (another dropout pass or augmentation of the same text),
  whose similarity to the row is 1.0 for unit vectors: the positive score of every margin.

For each anchor:

1. window: its nearest corpus entries by the index (or an exact scan, `exact`), across every
   shard. Pairs: the range_max + p nearest distinct texts, p the most rows an anchor text has
   in one shard of the anchors, over all of them (sentence-transformers: the most rows a query
   has in the dataset; counted before the pass, so the same however the pairs are sharded),
   its positives among them and then dropped; a text the corpus holds in several rows (a
   positive of several anchors) is one entry, as in sentence-transformers' de-duplicated
   corpus. Unlabelled: the range_max nearest other rows (the row itself is dropped). range_max
   null: derived as sentence-transformers does (MiningConfig.window_max).
2. filters: drop the anchor's positives (pairs: by text), candidates whose text equals the
   anchor's, candidates from the anchor's own `document` (document corpora), candidates scoring
   above max_score or below min_score (keep min_score ≤ score ≤ max_score), and candidates
   within a margin of the positive score P: relative, keep only score ≤ P − |P| ×
   relative_margin; absolute, keep only score + absolute_margin ≤ P.
3. sampling: skip the first `range_min` candidates that pass; "top" keeps the next
   `num_negatives` (NV-Retriever's TopK-PercPos with relative_margin 0.05); "random" keeps
   `num_negatives` of the passing candidates ranked range_min + 1 … range_max among them (all
   of them where there are no more), drawn at random, written most similar first. The draw
   ranks the candidates by a hash of (seed, anchor, candidate) and keeps the lowest: anchor
   and candidate are row ids (unlabelled) or texts (pairs: the entries of
   sentence-transformers' de-duplicated queries and corpus), so a rerun, any sharding and any
   number of tasks give the same negatives for the same candidates.

An anchor text that several rows of one shard share is one query, as sentence-transformers
de-duplicates its queries: all its positives are dropped, the margins are measured against the
lowest of their scores, and each of its rows gets the same negatives. The same anchor in rows of
different shards is mined once per shard, each time dropping only that shard's positives of it
(pair tables list a query's positives together; the embed job's block_rows cuts the shards).

Differences from sentence-transformers: "random" draws from its own generator, not Python's
`random` (the same rule, other draws); a candidate with the anchor's own text is never a
negative (sentence-transformers would keep it where the margin lets it through); and for
unlabelled rows a negative is kept only strictly below the threshold (`<`, where the labelled
rule, as sentence-transformers, keeps one exactly on it): with margin 0 a copy of the anchor
(similarity 1.0 under another spelling) is then still refused.

The pass is Ray Data `map_batches` over the anchors' shard files, one task per shard (pairs:
after a first, light one that reads only each anchors' shard's texts, to count p): each task
reads its shard's rows as anchors (and, for pairs, their positives from `embeddings` by id),
queries every shard's index in turn (read from OUT, one at a time, merged as a running top-k:
search.py), reads the candidates' ids, texts and documents from their shards, and writes
`negatives/part-<first_id>.parquet` (one row per negative: PAIRS_SCHEMA or SENTENCES_SCHEMA) to
the output directory. The driver receives only each shard's counts and writes summary.json
beside them, with the number of anchors that got no negative.

Query and document prompts: the anchors are the queries (sentence-transformers embeds them
with `encode_query`), the corpus the documents (`encode_document`); here both are the embed
job's outputs, so a prompt role is chosen when each output is embedded, not here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from distributed_emb.checks import ConfigError
from distributed_emb.progress_report import Progress
from distributed_emb.storage import exists, has_files, join, write_bytes, write_text
from distributed_emb.vectors.ann_index import read_index_info
from distributed_emb.vectors.mining_config import MiningConfig
from distributed_emb.vectors.search import lookup_columns, search_keys
from distributed_emb.vectors.shard_layout import (
    DOCUMENT,
    EMBEDDING,
    ID,
    TEXT,
    Manifest,
    ShardLayoutError,
    read_calibration,
    read_manifest,
    read_shard,
    shard_columns,
    unit_vectors,
)

log = logging.getLogger(__name__)

POSITIVE_SCORE = 1.0  # a unit vector's similarity to itself: the anchor's own second view
SUMMARY = "summary.json"
# The Parquet files in a folder of their own: pyarrow, Ray Data and `datasets` read a folder
# of Parquet whole, and summary.json or run.log beside them would break that.
NEGATIVES_DIR = "negatives"
# Each output names its texts as training reads its kind by default (data/data_config.py), so
# `data.path=DIR/negatives data.negative_column=negative` is all a training run needs:
# pairs as sentence-transformers' triplets, read by `data.kind=pairs` (anchor_column,
# positive_column); unlabelled rows keep `text`, what `data.kind=sentences` reads
# (text_column): an unlabelled row has no positive column, and calling its text `anchor` would
# make a sentences run name a column a pairs run means otherwise.
PAIRS_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),  # the pair's row id (its anchor's and its positive's)
        ("anchor", pa.string()),
        ("positive", pa.string()),
        ("negative", pa.string()),
        ("negative_id", pa.int64()),
        ("positive_score", pa.float32()),
        ("negative_score", pa.float32()),
    ]
)
SENTENCES_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("text", pa.string()),
        ("negative", pa.string()),
        ("negative_id", pa.int64()),
        ("negative_score", pa.float32()),
    ]
)


@dataclass
class ShardCounts:
    """What mining one shard's anchors gave: written to summary.json."""

    shard: str
    anchors: int = 0  # rows of the anchors' shard (pairs: pairs)
    negatives: int = 0
    anchors_without_negative: int = 0
    anchors_with_fewer: int = 0  # some negatives, but fewer than num_negatives
    # Pairs whose positive `embeddings` does not hold (dropped when its column was read): they
    # have no positive score to measure a margin against, so they get no negative.
    pairs_without_positive: int = 0
    # Candidates inside the window each filter removed (one candidate may count under several).
    removed_by_margin: int = 0
    removed_above_max_score: int = 0
    removed_below_min_score: int = 0
    removed_same_document: int = 0
    removed_same_text: int = 0


@dataclass
class Candidates:
    """Each anchor's nearest rows, best first: (n, m) arrays; ids −1 past the corpus's end."""

    ids: np.ndarray
    scores: np.ndarray
    texts: np.ndarray  # object
    documents: np.ndarray | None  # −1 where a row has none; None for sentence corpora


@dataclass
class Queries:
    """The anchors that are searched, one per query: (q,) arrays."""

    texts: np.ndarray  # object
    documents: np.ndarray | None  # None: no document column
    positive_scores: np.ndarray  # float32: what each margin is measured against
    # Unlabelled: each anchor's own row id (never its own negative), positives None. Pairs: the
    # texts of its positives (dropped from its candidates), ids None; `window` is then the
    # number of distinct texts it looks at (range_max + the most positives an anchor has).
    ids: np.ndarray | None = None
    positives: list[set[str]] | None = None
    window: int = 0


def margin_keeps(
    scores: np.ndarray, positive_scores: np.ndarray, config: MiningConfig, strict: bool
) -> np.ndarray:
    """(n, m) bool: the candidates outside both margins of their anchor's positive score P:
    score + absolute_margin ≤ P and score ≤ P − |P| × relative_margin (`strict`: <), in
    float32 as sentence-transformers computes them; an unset margin keeps everything."""
    positive = np.asarray(positive_scores, dtype=np.float32)[:, None]
    scores = np.asarray(scores, dtype=np.float32)
    below = np.less if strict else np.less_equal
    keeps = np.ones(scores.shape, dtype=bool)
    if config.absolute_margin is not None:
        keeps &= below(scores + np.float32(config.absolute_margin), positive)
    if config.relative_margin is not None:
        threshold = positive - np.abs(positive) * np.float32(config.relative_margin)
        keeps &= below(scores, threshold)
    return keeps


def distinct_texts(texts: np.ndarray) -> np.ndarray:
    """(n, m) bool: each row's first candidate of each text (None is no candidate)."""
    first = np.zeros(texts.shape, dtype=bool)
    for i, row in enumerate(texts):
        seen: set[str] = set()
        for j, text in enumerate(row):
            if text is not None and text not in seen:
                seen.add(text)
                first[i, j] = True
    return first


def choose_negatives(
    queries: Queries,
    candidates: Candidates,
    config: MiningConfig,
    counts: ShardCounts | None = None,
) -> np.ndarray:
    """(q, m) bool: which candidates become negatives (steps 1–3 of the module docstring).
    Candidates must be sorted best first in each row, and config.range_max set (mine_shard
    resolves a null one: MiningConfig.window_max). Adds what each filter removed to
    `counts`."""
    ids, scores, texts = candidates.ids, candidates.scores, candidates.texts
    if queries.positives is None:  # unlabelled: the range_max nearest other rows
        others = (ids >= 0) & (ids != queries.ids[:, None])  # a row is never its own negative
        window = others & (np.cumsum(others, axis=1) <= config.range_max)
    else:  # pairs: the nearest distinct texts, positives among them, then the positives out
        entries = distinct_texts(texts)
        nearest = entries & (np.cumsum(entries, axis=1) <= queries.window)
        positive = np.array(
            [[text in own for text in row] for row, own in zip(texts, queries.positives)],
            dtype=bool,
        ).reshape(texts.shape)
        window = nearest & ~positive
    margin_ok = margin_keeps(scores, queries.positive_scores, config, queries.positives is None)
    # As sentence-transformers compares its float32 scores: `scores > max_score` and
    # `scores < min_score` are removed.
    scores32 = np.asarray(scores, dtype=np.float32)
    below_max = np.ones_like(window)
    if config.max_score is not None:
        below_max = ~(scores32 > np.float32(config.max_score))
    above_min = np.ones_like(window)
    if config.min_score is not None:
        above_min = ~(scores32 < np.float32(config.min_score))
    other_text = texts != queries.texts[:, None]
    other_document = np.ones_like(window)
    if config.skip_same_document and queries.documents is not None:
        if candidates.documents is not None:
            other_document = candidates.documents != queries.documents[:, None]
    kept = window & margin_ok & below_max & above_min & other_text & other_document
    passed = np.cumsum(kept, axis=1)  # 1-based rank among those that pass
    if config.sampling_strategy == "top":
        last = config.range_min + config.num_negatives
        chosen = kept & (passed > config.range_min) & (passed <= last)
    else:
        allowed = kept & (passed > config.range_min) & (passed <= config.range_max)
        chosen = draw(allowed, sample_keys(queries, candidates, config.seed), config.num_negatives)
    if counts is not None:
        counts.removed_by_margin += int((window & ~margin_ok).sum())
        counts.removed_above_max_score += int((window & ~below_max).sum())
        counts.removed_below_min_score += int((window & ~above_min).sum())
        counts.removed_same_text += int((window & ~other_text).sum())
        counts.removed_same_document += int((window & ~other_document).sum())
    return chosen


def draw(allowed: np.ndarray, keys: np.ndarray, k: int) -> np.ndarray:
    """(q, m) bool: in each row, the k allowed places with the lowest keys (every allowed one
    where there are no more than k). Keys that are independent uniform draws make it a uniform
    random k-subset of the allowed."""
    masked = np.where(allowed, keys, np.iinfo(np.uint64).max)
    lowest = np.argsort(masked, axis=1, kind="stable")[:, :k]
    chosen = np.zeros(allowed.shape, dtype=bool)
    np.put_along_axis(chosen, lowest, True, axis=1)
    return chosen & allowed


def sample_keys(queries: Queries, candidates: Candidates, seed: int) -> np.ndarray:
    """(q, m) uint64: a hash of (seed, anchor, candidate), each anchor and candidate named by
    its row id (unlabelled) or its text (pairs), so that the draw depends on neither the
    sharding nor the order candidates come in."""
    if queries.positives is None:
        anchor, candidate = _id_keys(queries.ids), _id_keys(candidates.ids)
    else:
        anchor, candidate = _text_keys(queries.texts), _text_keys(candidates.texts)
    seeded = _mix(anchor ^ _mix(np.full(anchor.shape, seed, dtype=np.uint64)))
    return _mix(seeded[:, None] ^ candidate)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise (uint64 arithmetic wraps)."""
    x = np.asarray(x, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _id_keys(ids: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(ids, dtype=np.int64).view(np.uint64)


def _text_keys(texts: np.ndarray) -> np.ndarray:
    """uint64 of each text's 8-byte BLAKE2b (stable across runs and machines); 0 for None."""
    known: dict[str, int] = {}

    def key(text: str | None) -> int:
        if text is None:
            return 0
        found = known.get(text)
        if found is None:
            digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
            found = known[text] = int.from_bytes(digest, "little")
        return found

    flat = texts.ravel()
    keys = np.fromiter((key(t) for t in flat), dtype=np.uint64, count=flat.size)
    return keys.reshape(texts.shape)


def find_candidates(
    manifest: Manifest,
    queries: np.ndarray,
    config: MiningConfig,
    k: int | None = None,
    distinct: bool = False,
) -> Candidates:
    """The k nearest rows of each (unit) query (default range_max + 1: the query's own row
    among them), with their ids, texts and documents. `distinct`: as many rows as hold k
    distinct texts, searched again with twice the rows while a query has fewer and the corpus
    has more."""
    k = config.range_max + 1 if k is None else k
    rows = k
    while True:
        scores, keys = search_keys(
            manifest, queries, rows, exact=config.exact, ef_search=config.ef_search
        )
        found = lookup_columns(manifest, keys, [ID, TEXT, DOCUMENT])
        has_documents = bool((found[DOCUMENT] >= 0).any())
        candidates = Candidates(
            ids=found[ID],
            scores=scores,
            texts=found[TEXT],
            documents=found[DOCUMENT] if has_documents else None,
        )
        if not distinct or rows >= manifest.rows:
            return candidates
        short = (distinct_texts(candidates.texts).sum(axis=1) < k) & (candidates.ids[:, -1] >= 0)
        if not short.any():
            return candidates
        rows = min(2 * rows, manifest.rows)


def mine_shard(
    manifest: Manifest,
    number: int,
    config: MiningConfig,
    anchors: Manifest | None = None,
    max_positives: int | None = None,
) -> tuple[pa.Table, ShardCounts]:
    """The negatives of shard `number`'s anchors (rows of SENTENCES_SCHEMA, or PAIRS_SCHEMA when
    `anchors`, the pairs' anchor output, is given and `number` is its shard), anchor by anchor,
    most similar negative first, and its counts. In this process: the Ray pass runs it per
    task. Pairs: `max_positives` is p (most_positives; None: counted here, from every anchors'
    shard)."""
    if anchors is not None:
        if max_positives is None:
            max_positives = most_positives(anchors)
        return mine_pair_shard(manifest, anchors, number, config, max_positives)
    config = dataclasses.replace(config, range_max=config.window_max(1))
    rows = read_shard(manifest, number, (ID, EMBEDDING, TEXT, DOCUMENT))
    _require_text(rows, manifest)
    counts = ShardCounts(shard=rows.entry.file, anchors=len(rows.ids))
    if len(rows.ids) == 0:
        return SENTENCES_SCHEMA.empty_table(), counts
    ranges = read_calibration(manifest) if manifest.dtype == "int8" else None
    vectors = unit_vectors(rows, manifest, ranges)  # (n, d)
    queries = Queries(
        texts=rows.text,
        documents=rows.document,
        positive_scores=np.full(len(rows.ids), POSITIVE_SCORE, dtype=np.float32),
        ids=rows.ids,
    )
    candidates = find_candidates(manifest, vectors, config)
    chosen = choose_negatives(queries, candidates, config, counts)
    anchor_row, position = _count_chosen(chosen, config, counts)
    table = pa.table(
        {
            "id": pa.array(rows.ids[anchor_row], pa.int64()),
            "text": pa.array(rows.text[anchor_row].tolist(), pa.string()),
            "negative": pa.array(candidates.texts[anchor_row, position].tolist(), pa.string()),
            "negative_id": pa.array(candidates.ids[anchor_row, position], pa.int64()),
            "negative_score": pa.array(candidates.scores[anchor_row, position], pa.float32()),
        },
        schema=SENTENCES_SCHEMA,
    )
    return table, counts


def mine_pair_shard(
    manifest: Manifest, anchors: Manifest, number: int, config: MiningConfig, max_positives: int
) -> tuple[pa.Table, ShardCounts]:
    """Pairs: the negatives of the anchors in shard `number` of `anchors`, searched among the
    rows of `manifest` (the positives' output); PAIRS_SCHEMA rows, pair by pair. Each window
    holds range_max + `max_positives` distinct texts."""
    config = dataclasses.replace(config, range_max=config.window_max(max_positives))
    rows = read_shard(anchors, number, (ID, EMBEDDING, TEXT, DOCUMENT))
    _require_text(rows, anchors)
    counts = ShardCounts(shard=rows.entry.file, anchors=len(rows.ids))
    ranges = read_calibration(anchors) if anchors.dtype == "int8" else None
    vectors = unit_vectors(rows, anchors, ranges) if len(rows.ids) else None
    positive_vectors, positive_texts = read_positives(manifest, rows.ids)
    has_positive = np.flatnonzero([text is not None for text in positive_texts])
    counts.pairs_without_positive = len(rows.ids) - len(has_positive)
    if len(has_positive) == 0:
        counts.anchors_without_negative = len(rows.ids)
        return PAIRS_SCHEMA.empty_table(), counts
    pair_scores = np.einsum("ij,ij->i", vectors, positive_vectors).astype(np.float32)
    # One query per distinct anchor text, its first row's vector (as sentence-transformers
    # embeds each distinct query once).
    query_of: dict[str, int] = {}
    group = np.array([query_of.setdefault(rows.text[r], len(query_of)) for r in has_positive])
    first_rows = has_positive[np.unique(group, return_index=True)[1]]
    positives: list[set[str]] = [set() for _ in first_rows]
    for r, g in zip(has_positive, group):
        positives[g].add(positive_texts[r])
    lowest = np.full(len(first_rows), np.inf, dtype=np.float32)
    np.minimum.at(lowest, group, pair_scores[has_positive])
    queries = Queries(
        texts=rows.text[first_rows],
        documents=None if rows.document is None else rows.document[first_rows],
        positive_scores=lowest,
        positives=positives,
        window=config.range_max + max(max_positives, int(np.bincount(group).max())),
    )
    candidates = find_candidates(
        manifest, vectors[first_rows], config, k=queries.window, distinct=True
    )
    chosen = choose_negatives(queries, candidates, config, counts)[group]  # (pairs, m)
    pair, position = _count_chosen(chosen, config, counts)
    counts.anchors_without_negative += counts.pairs_without_positive
    source = has_positive[pair]  # the pair's row in the anchors' shard
    query = group[pair]
    table = pa.table(
        {
            "id": pa.array(rows.ids[source], pa.int64()),
            "anchor": pa.array(rows.text[source].tolist(), pa.string()),
            "positive": pa.array(positive_texts[source].tolist(), pa.string()),
            "negative": pa.array(candidates.texts[query, position].tolist(), pa.string()),
            "negative_id": pa.array(candidates.ids[query, position], pa.int64()),
            "positive_score": pa.array(pair_scores[source], pa.float32()),
            "negative_score": pa.array(candidates.scores[query, position], pa.float32()),
        },
        schema=PAIRS_SCHEMA,
    )
    return table, counts


def shard_most_positives(anchors: Manifest, number: int) -> int:
    """The most rows one anchor text has in shard `number` of the anchors' output (a query's
    positives are its rows of one shard); 0 for an empty shard."""
    rows = read_shard(anchors, number, (TEXT,))
    _require_text(rows, anchors)
    repeats = Counter(rows.text.tolist()).most_common(1)
    return repeats[0][1] if repeats else 0


def most_positives(anchors: Manifest) -> int:
    """p of every pairs window: the most rows one anchor text has in a shard, over all of them
    (at least 1), read in this process (the Ray pass counts it per task: _count_batch)."""
    counts = [shard_most_positives(anchors, n) for n in range(len(anchors.shards))]
    return max([1, *counts])


def read_positives(manifest: Manifest, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(unit vectors (n, d), texts (n,) object) of the rows of `manifest` with these ids: zero
    vectors and None where it has no such row. Reads only the shards whose id range holds one
    (shards are named by their first id and hold sorted ids)."""
    vectors = np.zeros((len(ids), manifest.dim), dtype=np.float32)
    texts = np.full(len(ids), None, dtype=object)
    if len(ids) == 0 or not manifest.shards:
        return vectors, texts
    order = np.argsort([entry.first_id for entry in manifest.shards], kind="stable")
    first_ids = np.array([manifest.shards[n].first_id for n in order], dtype=np.int64)
    at = np.searchsorted(first_ids, ids, side="right") - 1  # the shard whose range holds each
    ranges = read_calibration(manifest) if manifest.dtype == "int8" else None
    for place in np.unique(at[at >= 0]):
        here = np.flatnonzero(at == place)
        shard = read_shard(manifest, int(order[place]), (ID, EMBEDDING, TEXT))
        if len(shard.ids) == 0:
            continue
        rows = np.minimum(np.searchsorted(shard.ids, ids[here]), len(shard.ids) - 1)
        hit = shard.ids[rows] == ids[here]
        vectors[here[hit]] = unit_vectors(shard, manifest, ranges)[rows[hit]]
        if shard.text is not None:
            texts[here[hit]] = shard.text[rows[hit]]
    return vectors, texts


def _count_chosen(
    chosen: np.ndarray, config: MiningConfig, counts: ShardCounts
) -> tuple[np.ndarray, np.ndarray]:
    """Adds the chosen negatives to `counts`; their (row, position), row-major: anchor by
    anchor, best first."""
    per_anchor = chosen.sum(axis=1)
    counts.negatives = int(per_anchor.sum())
    counts.anchors_without_negative = int((per_anchor == 0).sum())
    counts.anchors_with_fewer = int(((per_anchor > 0) & (per_anchor < config.num_negatives)).sum())
    return np.nonzero(chosen)


def _require_text(shard, manifest: Manifest) -> None:
    if shard.text is None:
        raise ShardLayoutError(
            f"{manifest.shard_location(shard.number)}: no text column: mining writes the "
            "anchors' and negatives' texts; embed with the text kept"
        )


def output_file(manifest: Manifest, number: int) -> str:
    """negatives/part-<first_id:012d>.parquet, named after the anchors' shard."""
    return f"{NEGATIVES_DIR}/part-{manifest.shards[number].first_id:012d}.parquet"


def mine_and_write(
    manifest: Manifest,
    number: int,
    config: MiningConfig,
    anchors: Manifest | None = None,
    max_positives: int | None = None,
) -> ShardCounts:
    """mine_shard, then its table written whole to output.dir (storage.write_bytes)."""
    import faiss

    # The task's CPUs, not every core of a node other tasks share.
    faiss.omp_set_num_threads(max(1, int(config.cpus_per_task)))
    table, counts = mine_shard(manifest, number, config, anchors, max_positives)
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    named_after = manifest if anchors is None else anchors
    write_bytes(join(config.output.dir, output_file(named_after, number)), buffer.getvalue())
    return counts


def check_inputs(config: MiningConfig) -> tuple[Manifest, Manifest | None]:
    """Before Ray starts: the manifests (`embeddings`, and `anchors` for pairs: the same model,
    backend and corpus), a text column, float vectors, the index (unless `exact`), and an output
    directory without earlier negatives (run.log may be there: the job's own log). Returns
    (embeddings, anchors or None). Raises ShardLayoutError / ConfigError."""
    manifest = _checked_manifest(config.embeddings)
    anchors = None
    if config.anchors is not None:
        anchors = _checked_manifest(config.anchors)
        for key in ("model", "dim", "corpus", "backend"):
            theirs, ours = getattr(anchors, key), getattr(manifest, key)
            if theirs != ours:
                raise ConfigError(
                    f"anchors: {anchors.path} has {key} {theirs!r}, embeddings {ours!r}: a pair "
                    "table's anchor and positive columns are embedded by one model from one "
                    "corpus (their rows share ids)"
                )
    if not config.exact:
        read_index_info(manifest)
    output = config.output.dir
    if has_files(join(output, NEGATIVES_DIR)) or exists(join(output, SUMMARY)):
        raise ConfigError(
            f"output.dir: {output} holds earlier negatives: choose another directory or "
            "delete them (part files of two runs would mix)"
        )
    return manifest, anchors


def _checked_manifest(out: str) -> Manifest:
    """The manifest of an output mining can read: texts kept, float vectors."""
    manifest = read_manifest(out)
    if manifest.shards and TEXT not in shard_columns(manifest):
        raise ShardLayoutError(
            f"{manifest.shard_location(0)}: no text column: mining writes the anchors' and "
            "negatives' texts; embed with the text kept"
        )
    if manifest.dtype == "ubinary":
        raise ShardLayoutError(
            f"{manifest.path}: dtype ubinary: mining compares float vectors by inner product; "
            "embed with dtype float32 or int8"
        )
    return manifest


def _mine_batch(
    batch: dict[str, np.ndarray],
    manifest: Manifest,
    config: MiningConfig,
    anchors: Manifest | None = None,
    max_positives: int | None = None,
):
    """map_batches over shard numbers: each shard mined and written; its counts returned."""
    rows = [
        dataclasses.asdict(mine_and_write(manifest, int(n), config, anchors, max_positives))
        for n in batch["shard"]
    ]
    return {name: np.array([row[name] for row in rows]) for name in rows[0]}


def _count_batch(batch: dict[str, np.ndarray], anchors: Manifest):
    """map_batches over the anchors' shard numbers: each shard's shard_most_positives."""
    return {"most": np.array([shard_most_positives(anchors, int(n)) for n in batch["shard"]])}


def _ray_most_positives(anchors: Manifest, config: MiningConfig, numbers: list[int]) -> int:
    """most_positives as a light Ray Data pass (each task reads one shard's texts)."""
    import ray

    from distributed_emb.watchdog import no_silent_stall

    shards = ray.data.from_items([{"shard": n} for n in numbers], override_num_blocks=len(numbers))
    counted = shards.map_batches(
        _count_batch,
        fn_kwargs={"anchors": anchors},
        batch_size=1,
        batch_format="numpy",
        num_cpus=config.cpus_per_task,
    )
    with no_silent_stall(config.stall_timeout_s, hint="fix: cpus_per_task, or the cluster's nodes"):
        found = [int(row["most"]) for row in counted.iter_rows()]
    return max([1, *found])


def mine_hard_negatives(config: MiningConfig) -> dict:
    """The Ray Data pass (one task per anchors' shard, `config.cpus_per_task` CPUs each; Ray
    must be up) and summary.json in output.dir; returns the summary."""
    import ray

    from distributed_emb.watchdog import no_silent_stall

    manifest, anchors = check_inputs(config)
    numbers = list(range(len((manifest if anchors is None else anchors).shards)))
    max_positives = 1  # unlabelled: the row's own second view
    if anchors is not None and numbers:
        max_positives = _ray_most_positives(anchors, config, numbers)
    rows: list[dict] = []
    if numbers:
        shards = ray.data.from_items(
            [{"shard": n} for n in numbers], override_num_blocks=len(numbers)
        )
        mined = shards.map_batches(
            _mine_batch,
            fn_kwargs={
                "manifest": manifest,
                "config": config,
                "anchors": anchors,
                "max_positives": max_positives,
            },
            batch_size=1,
            batch_format="numpy",
            num_cpus=config.cpus_per_task,
        )
        hint = "fix: cpus_per_task, or the cluster's nodes"
        with (
            no_silent_stall(config.stall_timeout_s, hint=hint),
            Progress("mine", len(numbers), "shards") as progress,
        ):
            for batch in mined.iter_batches(batch_size=None, batch_format="numpy"):
                found = [dict(zip(batch, values, strict=True)) for values in zip(*batch.values())]
                rows.extend(found)
                progress.update(len(found))
    per_shard = sorted(
        ({key: _plain(value) for key, value in row.items()} for row in rows),
        key=lambda row: row["shard"],
    )
    totals = {
        key: sum(row[key] for row in per_shard)
        for key in (f.name for f in dataclasses.fields(ShardCounts))
        if key != "shard"
    }
    summary = {
        "embeddings": str(config.embeddings),
        "anchors": config.anchors,  # null: unlabelled
        **totals,
        "settings": {
            **{
                name: getattr(config, name)
                for name in (
                    "num_negatives",
                    "range_min",
                    "range_max",
                    "max_score",
                    "min_score",
                    "relative_margin",
                    "absolute_margin",
                    "sampling_strategy",
                    "seed",
                    "skip_same_document",
                    "exact",
                    "ef_search",
                )
            },
            # What the windows used: range_max (derived where it is null), and p, the most
            # positives an anchor has (unlabelled: 1).
            "window_range_max": config.window_max(max_positives),
            "max_positives": max_positives,
        },
        "shards": per_shard,
    }
    write_text(join(config.output.dir, SUMMARY), json.dumps(summary, indent=2) + "\n")
    log.info(
        "mined %d negatives for %d anchors; %d anchors got none",
        summary["negatives"],
        summary["anchors"],
        summary["anchors_without_negative"],
    )
    return summary


def _plain(value):
    """A numpy scalar from Ray Data's batches as the Python value JSON writes."""
    return value.item() if hasattr(value, "item") else value
