"""Retrieval evaluation on the user's own data in the BEIR layout: read, search, score.

The layout (corpus.jsonl, queries.jsonl, qrels/<split>.tsv) is read and checked by
data/beir_layout.py, whose names this module re-exports.

Search (:func:`search`) is exact cosine search, embedded and scored shard by shard so no
process holds all corpus vectors: each shard's top hits are merged into a running top-k per
query. A hit whose document id equals the query id is dropped (BEIR's `ignore_identical_ids`:
in sets such as Quora or ArguAna a query is also a document). Scores are float64 dot products
of the unit-length float32 vectors, summed in an order fixed by the dimension alone, so the
run is a function of the embeddings, the same for any shard size (a matrix product's rounding
depends on the shapes). Ties are broken by document id, descending — trec_eval's own order —
so the hits kept are the ones trec_eval would rank first. :func:`evaluate_splits` searches
several splits' queries in one pass, the corpus embedded once.

Queries and documents: `encode` is one encoder for both (a plain callable: the in-training
evaluation, the tests) or a pair (query encoder, document encoder), as the evaluation job
gives for a model with query and document prompts (model/embedder.py RoleEncoders: the
queries embedded as sentence-transformers' ``encode_query`` embeds them, the corpus as
``encode_document``, which is what its InformationRetrievalEvaluator does).

Metrics come from pytrec_eval (`pytrec-eval-terrier`), never re-derived: it wraps trec_eval,
the reference implementation, and BEIR and MTEB compute their retrieval metrics with it, so our
numbers equal theirs for the same run; it is a small binary wheel needing only numpy and scipy
(ranx would pull in numba and llvmlite). Its conventions are ours: nDCG's gain is the
relevance value itself (linear, as trec_eval and BEIR), the ideal ranking is built from every
judged document of the query; a judgment ≥ 1 counts as relevant for MAP, recall and MRR.
MRR@10 is trec_eval's `recip_rank` on the run cut to its top 10 (`recip_rank` has no cutoff).
Every value is × 100 (as the suite's Spearman and MRR), and a split's mean is over all its
queries — one that got no hits counts 0 (BEIR averages over the queries its run holds).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytrec_eval

# The layout's reader lives low in the layers (config checks a directory before Ray starts);
# its names are this module's API too: callers read, search and score through `beir`.
from distributed_emb.data.beir_layout import (  # noqa: F401
    CORPUS_FILE,
    EXPECTED_LAYOUT,
    QRELS_DIR,
    QUERIES_FILE,
    BeirDataError,
    RetrievalSplit,
    list_splits,
    read_split,
    read_splits,
)

Encoder = Callable[[list[str]], np.ndarray]
# One encoder for queries and documents alike, or (query encoder, document encoder).
Encoders = Encoder | tuple[Encoder, Encoder]

METRICS = ("ndcg@10", "map@100", "recall@1", "recall@10", "recall@100", "mrr@10")
# Our name → (pytrec_eval measure to ask for, the key it answers under).
_TREC_MEASURES = {
    "ndcg@10": ("ndcg_cut.10", "ndcg_cut_10"),
    "map@100": ("map_cut.100", "map_cut_100"),
    "recall@1": ("recall.1", "recall_1"),
    "recall@10": ("recall.10", "recall_10"),
    "recall@100": ("recall.100", "recall_100"),
}
MRR_CUTOFF = 10

# Scores of one block of queries against one shard: at most this many float32s (64 MB).
_BLOCK_SCORES = 1 << 24
# Candidate (query, document) pairs re-scored exactly at a time (a (n, d) float64 product).
_RESCORE_PAIRS = 1 << 13


# --- search -----------------------------------------------------------------------------------


def _unit_rows(embeddings: np.ndarray, expected_rows: int) -> np.ndarray:
    """(n, d) float32 rows scaled to unit length (a zero row stays zero: cosine 0)."""
    x = np.asarray(embeddings, dtype=np.float32)
    if x.ndim != 2 or x.shape[0] != expected_rows:
        raise ValueError(f"the encoder returned shape {x.shape} for {expected_rows} texts")
    if not np.isfinite(x).all():
        raise ValueError("the encoder returned a non-finite embedding")
    norms = np.linalg.norm(x, axis=1, keepdims=True)  # (n, 1)
    return x / np.maximum(norms, np.float32(1e-12))


def _exact_scores(queries: np.ndarray, shard: np.ndarray, rows: np.ndarray, cols: np.ndarray):
    """Dot products of the pairs (queries[rows], shard[cols]) in float64: each float32 product
    is exact there, and a row's sum runs in an order fixed by d alone (numpy's pairwise sum of
    a contiguous row), unlike a matrix product, whose rounding depends on the shapes."""
    out = np.empty(len(rows), dtype=np.float64)
    for start in range(0, len(rows), _RESCORE_PAIRS):
        stop = start + _RESCORE_PAIRS
        a = queries[rows[start:stop]].astype(np.float64)  # (p, d)
        b = shard[cols[start:stop]].astype(np.float64)  # (p, d)
        out[start:stop] = (a * b).sum(axis=1)
    return out


def _shard_candidates(
    queries: np.ndarray, shard: np.ndarray, own: np.ndarray, top_k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(query rows, shard columns, exact scores) of a superset of each query's exact top-k in
    `shard`. A float32 matrix product finds them; it is off from the exact score by at most
    d·2⁻²⁴ for unit vectors, so keeping all within twice that of the k-th keeps every exact
    top-k member (and ties), and the exact scores then decide. own: (q,) the column of the
    query's own id in this shard, or -1."""
    n_queries, dim = queries.shape
    n_docs = shard.shape[0]
    margin = np.float32(2 * (dim + 2) * 2.0**-23)  # 2ε, ε = 2(d+2)·2⁻²⁴: the bound with room
    block = max(1, _BLOCK_SCORES // max(n_docs, 1))
    rows_found, cols_found = [], []
    for start in range(0, n_queries, block):
        stop = min(start + block, n_queries)
        scores = queries[start:stop] @ shard.T  # (b, s) float32
        mine = np.flatnonzero(own[start:stop] >= 0)
        scores[mine, own[start:stop][mine]] = -np.inf  # ignore_identical_ids
        if n_docs > top_k:
            kth = np.partition(scores, n_docs - top_k, axis=1)[:, n_docs - top_k]  # (b,)
            keep = scores >= (kth - margin)[:, None]
        else:
            keep = np.ones_like(scores, dtype=bool)
        keep[mine, own[start:stop][mine]] = False
        rows, cols = np.nonzero(keep)
        rows_found.append(rows + start)
        cols_found.append(cols)
    rows = np.concatenate(rows_found).astype(np.int64)
    cols = np.concatenate(cols_found).astype(np.int64)
    return rows, cols, _exact_scores(queries, shard, rows, cols)


def _best_per_query(
    rows: np.ndarray, scores: np.ndarray, docs: np.ndarray, id_rank: np.ndarray, top_k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The first top_k hits of each query row by (score desc, document id desc)."""
    order = np.lexsort((-id_rank[docs], -scores, rows))
    rows, scores, docs = rows[order], scores[order], docs[order]
    first = np.searchsorted(rows, rows, side="left")  # index of each row's first hit
    keep = np.arange(len(rows)) - first < top_k
    return rows[keep], scores[keep], docs[keep]


def query_and_document_encoders(encode: Encoders) -> tuple[Encoder, Encoder]:
    """(query encoder, document encoder) of `encode`: a pair as given, one encoder twice."""
    if isinstance(encode, tuple):
        if len(encode) != 2 or not all(callable(e) for e in encode):
            raise TypeError("encode: one encoder, or a pair (query encoder, document encoder)")
        return encode
    return encode, encode


def search(
    encode: Encoders, split: RetrievalSplit, top_k: int = 100, shard_size: int = 50_000
) -> dict[str, dict[str, float]]:
    """Exact cosine search: the run {query id: {document id: score}}, top_k hits a query.

    The corpus is embedded shard_size texts at a time (one `encode` call a shard, the queries
    with the first when one encoder embeds both: with the Ray Data encoder each shard is
    embedded by the actor pool), each shard's best hits merged into a running top-k, so at
    most one shard's vectors are held. `encode`: one encoder, or (query encoder, document
    encoder)."""
    if top_k < 1 or shard_size < 1:
        raise ValueError(f"top_k and shard_size must be >= 1, got {top_k} and {shard_size}")
    encode_queries, encode_documents = query_and_document_encoders(encode)
    n_queries = len(split.query_ids)
    if n_queries == 0:
        return {}
    first_shard = None
    if encode_queries is encode_documents:
        # The queries ride along with the first shard: one encode call (one actor pool) fewer.
        first = list(split.query_texts) + list(split.corpus_texts[:shard_size])
        first_embedded = _unit_rows(encode_queries(first), len(first))  # (q + s, d)
        queries = first_embedded[:n_queries]  # (q, d)
        first_shard = first_embedded[n_queries:]  # (s, d)
    else:
        queries = _unit_rows(encode_queries(list(split.query_texts)), n_queries)  # (q, d)
    n_corpus = len(split.corpus_ids)
    id_rank = np.empty(n_corpus, dtype=np.int64)  # each document's place in sorted id order
    id_rank[sorted(range(n_corpus), key=split.corpus_ids.__getitem__)] = np.arange(n_corpus)
    corpus_index = {doc_id: i for i, doc_id in enumerate(split.corpus_ids)}
    own_doc = np.array([corpus_index.get(q, -1) for q in split.query_ids], dtype=np.int64)
    rows = np.empty(0, dtype=np.int64)
    scores = np.empty(0, dtype=np.float64)
    docs = np.empty(0, dtype=np.int64)
    for start in range(0, len(split.corpus_texts), shard_size):
        texts = split.corpus_texts[start : start + shard_size]
        if start == 0 and first_shard is not None:
            shard = first_shard
        else:
            shard = _unit_rows(encode_documents(list(texts)), len(texts))  # (s, d)
        in_shard = (own_doc >= start) & (own_doc < start + len(texts))
        own = np.where(in_shard, own_doc - start, -1)
        new_rows, cols, new_scores = _shard_candidates(queries, shard, own, top_k)
        rows, scores, docs = _best_per_query(
            np.concatenate([rows, new_rows]),
            np.concatenate([scores, new_scores]),
            np.concatenate([docs, cols + start]),
            id_rank,
            top_k,
        )
    run: dict[str, dict[str, float]] = {q: {} for q in split.query_ids}
    for row, score, doc in zip(rows.tolist(), scores.tolist(), docs.tolist()):
        run[split.query_ids[row]][split.corpus_ids[doc]] = score
    return run


# --- metrics ----------------------------------------------------------------------------------


def _ranked(hits: dict[str, float]) -> list[tuple[str, float]]:
    """A query's hits in trec_eval's order: score descending, then document id descending."""
    return sorted(hits.items(), key=lambda hit: (hit[1], hit[0]), reverse=True)


def per_query_metrics(
    qrels: dict[str, dict[str, int]], run: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    """{metric: {query id: value × 100}} for every query of `qrels` with a relevant document
    (a judgment ≥ 1); a query the run has no hits for scores 0."""
    judged = {
        q: {doc: int(score) for doc, score in docs.items()}
        for q, docs in qrels.items()
        if any(score >= 1 for score in docs.values())
    }
    hits = {q: {doc: float(s) for doc, s in run[q].items()} for q in judged if run.get(q)}
    measures = {measure for measure, _ in _TREC_MEASURES.values()}
    answered = pytrec_eval.RelevanceEvaluator(judged, measures).evaluate(hits)
    top = {q: dict(_ranked(docs)[:MRR_CUTOFF]) for q, docs in hits.items()}
    reciprocal = pytrec_eval.RelevanceEvaluator(judged, {"recip_rank"}).evaluate(top)
    out: dict[str, dict[str, float]] = {}
    for metric, (_, key) in _TREC_MEASURES.items():
        out[metric] = {q: 100.0 * answered.get(q, {}).get(key, 0.0) for q in judged}
    out["mrr@10"] = {q: 100.0 * reciprocal.get(q, {}).get("recip_rank", 0.0) for q in judged}
    return {metric: out[metric] for metric in METRICS}


def retrieval_metrics(
    qrels: dict[str, dict[str, int]], run: dict[str, dict[str, float]]
) -> dict[str, float]:
    """{metric: mean × 100} over every query of `qrels` with a relevant document."""
    return _means(per_query_metrics(qrels, run))


def _means(per_query: dict[str, dict[str, float]]) -> dict[str, float]:
    if not per_query[METRICS[0]]:
        raise ValueError("no query has a relevant document (a judgment >= 1)")
    return {metric: float(np.mean(list(values.values()))) for metric, values in per_query.items()}


def evaluate_split(encode: Encoders, directory: str, split: str, top_k: int = 100) -> dict:
    """Read `split` of `directory`, search it with `encode` and score the run:
    {"split", "n_queries", "n_corpus", "metrics": {metric: mean}, "per_query": {metric:
    {query id: value}}}."""
    return evaluate_splits(encode, directory, [split], top_k)[split]


def evaluate_splits(
    encode: Encoders, directory: str, splits: list[str], top_k: int = 100
) -> dict[str, dict]:
    """:func:`evaluate_split` of each of `splits` with one pass over the corpus
    (:func:`score_splits`)."""
    return score_splits(encode, read_splits(directory, splits), top_k)


def score_splits(encode: Encoders, data: list[RetrievalSplit], top_k: int = 100) -> dict[str, dict]:
    """Search and score splits already read (:func:`read_splits`: one corpus): the splits'
    queries are searched together (a query's hits do not depend on the other queries), so
    the corpus, the costly part, is embedded once however many splits there are."""
    splits = [d.name for d in data]
    query_ids = list(dict.fromkeys(q for d in data for q in d.query_ids))
    text = {q: t for d in data for q, t in zip(d.query_ids, d.query_texts)}
    together = RetrievalSplit(
        name="+".join(splits),
        corpus_ids=data[0].corpus_ids,
        corpus_texts=data[0].corpus_texts,
        query_ids=query_ids,
        query_texts=[text[q] for q in query_ids],
        qrels={},
    )
    run = search(encode, together, top_k=top_k)
    results = {}
    for d in data:
        per_query = per_query_metrics(d.qrels, {q: run[q] for q in d.query_ids})
        results[d.name] = {
            "split": d.name,
            "n_queries": len(d.query_ids),
            "n_corpus": len(d.corpus_ids),
            "metrics": _means(per_query),
            "per_query": per_query,
        }
    return results
