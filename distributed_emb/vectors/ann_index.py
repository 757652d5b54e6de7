"""One approximate-nearest-neighbour index per embedding shard, with faiss.

    OUT/index/part-<first_id:012d>.faiss   one index per shard, row i = the shard's row i
    OUT/index/index.json                   written last: kind, parameters, dim, metric ("ip",
                                           or "hamming" for bits), and each shard's file, row
                                           count and kind

Every index compares unit vectors by inner product (cosine similarity): shard_layout's
`unit_vectors` gives them (normalising where the embed job did not, dequantising int8), and
queries are normalised the same way (search.py). Binary (ubinary) shards get faiss's binary
indexes over their bits (IndexBinaryFlat, IndexBinaryHNSW: 32× smaller than float vectors):
the query's sign bits find RESCORE_CANDIDATES × k candidates by Hamming distance, and each is
rescored with the float query against its ±1 vector (shard_layout.sign_vectors), which is how
sentence-transformers searches binary corpora; exact search scans every row with that score.
An index holds positions, not ids: a hit is
(shard, row), and the row's id and text are read from the shard (search.py), so the index
files stay the vectors plus the graph.

Why faiss (faiss-cpu on PyPI): it is Meta's library, maintained with regular releases, and the
faiss-cpu wheels (one abi3 wheel per platform, about 19 MB for Linux x86_64, NumPy 2 builds)
install without a compiler; sentence-transformers' own hard-negative mining and
quantised search use it. One library gives the exact index (IndexFlatIP, the reference), the
graph (IndexHNSWFlat) and the inverted lists (IndexIVFFlat), one serialisation for all, and
per-call search parameters (SearchParametersHNSW), so a search can raise efSearch without
touching a shared index; its binary indexes (flat and HNSW over bits, Hamming distance) serve
ubinary shards. usearch was the alternative: a smaller HNSW-only library whose native int8
and binary vectors would serve quantised shards without dequantising, but it has no
inverted-file index.

Which index for a shard. A shard is one block of the corpus: thousands to a few million rows.
- flat: exact, nothing to build, memory = the vectors; a query costs rows × d multiply-adds
  (20k × 384 ≈ 8 M: about 2 ms a query in batches on 2 cores), so below
  `index.flat_below_rows` (kind=auto) it is about as fast as a graph, and exact.
- HNSW (the default above that): no training pass, vectors added in one go; recall@10
  against exact search 0.998 at efSearch 32 and 0.9997 at 128 (M = 32, the 9,782 MiniLM
  embeddings of the shipped news corpus in one shard); costs the graph (2·M int32 links a row
  on the base layer: +18% over the vectors at d = 384) and a build of
  O(rows · log rows · efConstruction).
- IVF-Flat: needs k-means training (≥ 39 rows per list, √rows lists or more), and its recall
  is set by nprobe against a list size that varies with the shard; it pays when shards reach
  tens of millions of rows, or with product quantisation, where memory and not speed limits.
  At the shard sizes of this layout HNSW is the better trade, so IVF is not offered.
The index is built per shard, as Ray tasks (one per shard) when Ray is up and in this process
otherwise; each task reads its shard, builds, and writes its file; no process holds more than
one shard's vectors.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass

import faiss
import numpy as np

from distributed_emb.storage import (
    filesystem_of,
    is_remote,
    join,
    read_text,
    write_bytes,
    write_text,
)
from distributed_emb.vectors.index_config import IndexConfig
from distributed_emb.vectors.shard_layout import (
    EMBEDDING,
    ID,
    Manifest,
    ShardLayoutError,
    read_calibration,
    read_manifest,
    read_shard,
    sign_vectors,
    unit_vectors,
)
from distributed_emb.watchdog import DEFAULT_STALL_TIMEOUT_S, no_silent_stall

log = logging.getLogger(__name__)

INDEX_DIR = "index"
INDEX_INFO = "index.json"
INDEX_FORMAT = 1
METRIC = "ip"  # inner product on unit vectors
BINARY_METRIC = "hamming"  # ubinary shards: Hamming candidates, rescored by inner product
RESCORE_CANDIDATES = 4  # Hamming candidates per wanted hit of a binary index (rescored)
# Rescored candidates' ±1 vectors held at once (queries × candidates × dim floats: 64 MiB).
RESCORE_BLOCK = 16 * 1024 * 1024


def index_metric(manifest: Manifest) -> str:
    """How the shards' indexes compare: by inner product, or by the bits' Hamming distance."""
    return BINARY_METRIC if manifest.dtype == "ubinary" else METRIC


@dataclass(frozen=True)
class ShardIndex:
    """One shard's entry in index.json."""

    file: str  # relative to OUT: "index/part-000000000000.faiss"
    shard: str  # the shard it indexes, relative to OUT
    rows: int
    kind: str  # "hnsw" or "flat"


@dataclass(frozen=True)
class IndexInfo:
    """OUT/index/index.json: how the indexes were built, and one entry per shard."""

    location: str  # OUT
    kind: str  # the setting: auto, hnsw or flat
    parameters: dict
    dim: int
    shards: tuple[ShardIndex, ...]
    metric: str = METRIC

    def file_location(self, number: int) -> str:
        return join(self.location, self.shards[number].file)


def index_file(manifest: Manifest, number: int) -> str:
    """index/part-<first_id:012d>.faiss, named after the shard's own first id."""
    return f"{INDEX_DIR}/part-{manifest.shards[number].first_id:012d}.faiss"


def shard_kind(rows: int, settings: IndexConfig) -> str:
    if settings.kind != "auto":
        return settings.kind
    return "flat" if rows < settings.flat_below_rows else "hnsw"


def make_index(vectors: np.ndarray, kind: str, settings: IndexConfig) -> faiss.Index:
    """A faiss index over (n, d) unit vectors, inner product; label i = row i."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)  # faiss takes C-ordered float32
    dim = vectors.shape[1]
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, settings.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = settings.ef_construction
        index.hnsw.efSearch = settings.ef_search
    else:
        raise ValueError(f"unknown index kind {kind!r}")
    index.add(vectors)
    return index


def make_binary_index(bits: np.ndarray, dim: int, kind: str, settings: IndexConfig):
    """A faiss binary index over (n, dim/8) packed ubinary rows, Hamming distance; label i =
    row i. The HNSW graph takes the float index's settings."""
    bits = np.ascontiguousarray(bits, dtype=np.uint8)
    if kind == "flat":
        index = faiss.IndexBinaryFlat(dim)
    elif kind == "hnsw":
        index = faiss.IndexBinaryHNSW(dim, settings.hnsw_m)
        index.hnsw.efConstruction = settings.ef_construction
        index.hnsw.efSearch = settings.ef_search
    else:
        raise ValueError(f"unknown index kind {kind!r}")
    index.add(bits)
    return index


def build_shard_index(
    manifest: Manifest, number: int, settings: IndexConfig, threads: int | None = None
) -> ShardIndex:
    """Read shard `number`, build its index, write it to OUT/index/; its index.json entry.
    `threads`: faiss's threads in this process (None: as they are, every core by default)."""
    if threads is not None:
        faiss.omp_set_num_threads(threads)
    ranges = read_calibration(manifest) if manifest.dtype == "int8" else None
    shard = read_shard(manifest, number, (ID, EMBEDDING))
    rows = len(shard.ids)
    kind = shard_kind(rows, settings)
    if manifest.dtype == "ubinary":
        index = make_binary_index(shard.embeddings, manifest.dim, kind, settings)
        data = faiss.serialize_index_binary(index)
    else:
        index = make_index(unit_vectors(shard, manifest, ranges), kind, settings)
        data = faiss.serialize_index(index)
    file = index_file(manifest, number)
    write_bytes(join(manifest.location, file), data.tobytes())
    return ShardIndex(file=file, shard=manifest.shards[number].file, rows=rows, kind=kind)


def build_index(out: str, settings: IndexConfig, use_ray: bool | None = None) -> IndexInfo:
    """Build every shard's index under OUT/index/ and write index.json last.

    `use_ray`: one Ray task per shard (`settings.cpus_per_task` CPUs each); None: when Ray is
    initialised in this process. Without Ray the shards are built one after another here."""
    import ray

    manifest = read_manifest(out)
    numbers = range(len(manifest.shards))
    if use_ray is None:
        use_ray = ray.is_initialized()
    if use_ray:
        task = ray.remote(num_cpus=settings.cpus_per_task)(build_shard_index)
        # Each task's own CPUs, not every core of a node other tasks share.
        threads = max(1, int(settings.cpus_per_task))
        pending = [task.remote(manifest, number, settings, threads) for number in numbers]
        hint = "fix: index.cpus_per_task, or the cluster's nodes"
        with no_silent_stall(DEFAULT_STALL_TIMEOUT_S, hint=hint):
            entries = ray.get(pending)
    else:
        entries = [build_shard_index(manifest, number, settings) for number in numbers]
    info = IndexInfo(
        location=manifest.location,
        kind=settings.kind,
        parameters=dataclasses.asdict(settings),
        dim=manifest.dim,
        shards=tuple(entries),
        metric=index_metric(manifest),
    )
    write_text(join(out, INDEX_DIR, INDEX_INFO), _info_json(info))
    kinds = sorted({entry.kind for entry in entries})
    log.info("indexed %d shards (%s) under %s", len(entries), ", ".join(kinds), out)
    return info


def read_index_info(manifest: Manifest) -> IndexInfo:
    """OUT/index/index.json, checked against the manifest: an index built for other shards
    (the embeddings written again since) is refused, naming the rebuild."""
    location = join(manifest.location, INDEX_DIR, INDEX_INFO)
    text = read_text(location)
    if text is None:
        raise ShardLayoutError(
            f"{location}: missing: no index for these embeddings (build one with the embed "
            "job's --index, or search with --exact)"
        )
    try:
        tree = json.loads(text)
        if tree["format"] != INDEX_FORMAT:
            raise ShardLayoutError(
                f"{location}: format: {tree['format']} is not one this version reads "
                f"({INDEX_FORMAT})"
            )
        shards = tuple(
            ShardIndex(file=s["file"], shard=s["shard"], rows=s["rows"], kind=s["kind"])
            for s in tree["shards"]
        )
        info = IndexInfo(
            location=manifest.location,
            kind=tree["kind"],
            parameters=dict(tree["parameters"]),
            dim=tree["dim"],
            shards=shards,
            metric=tree["metric"],
        )
    except json.JSONDecodeError as error:
        raise ShardLayoutError(f"{location}: not valid JSON ({error.msg})") from None
    except (KeyError, TypeError) as error:
        raise ShardLayoutError(f"{location}: malformed: missing or wrong {error}") from None
    indexed = [(s.shard, s.rows) for s in info.shards]
    listed = [(s.file, s.rows) for s in manifest.shards]
    if indexed != listed or info.dim != manifest.dim or info.metric != index_metric(manifest):
        raise ShardLayoutError(
            f"{location}: built for other shards than {manifest.path} lists (the embeddings "
            "were written again since): rebuild the index"
        )
    return info


def load_shard_index(info: IndexInfo, number: int):
    """Shard `number`'s index (a faiss Index, or an IndexBinary for bits), read whole (a local
    file directly; object storage into memory)."""
    location = info.file_location(number)
    filesystem, path = filesystem_of(location)
    binary = info.metric == BINARY_METRIC
    try:
        if not is_remote(location):
            return faiss.read_index_binary(path) if binary else faiss.read_index(path)
        with filesystem.open_input_stream(path) as stream:
            data = np.frombuffer(stream.read(), dtype=np.uint8)
        return faiss.deserialize_index_binary(data) if binary else faiss.deserialize_index(data)
    except (RuntimeError, OSError) as error:  # faiss raises RuntimeError for a bad file
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error)
        raise ShardLayoutError(f"{location}: not a readable faiss index ({reason})") from None


def search_index(
    index, queries: np.ndarray, k: int, ef_search: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(scores (q, k) float32, rows (q, k) int64) of the k best rows for each unit query;
    where the shard has fewer than k rows, the rest are rows −1 with score −inf.
    `ef_search` (HNSW): candidates kept per query, at least k. A binary index's scores are
    the rescored ones (:func:`_search_binary`)."""
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    if isinstance(index, faiss.IndexBinary):
        return _search_binary(index, queries, k, ef_search)
    scores, rows = index.search(queries, k, params=_hnsw_parameters(index, k, ef_search))
    scores[rows < 0] = -np.inf  # faiss marks a missing hit with −3.4e38
    return scores, rows.astype(np.int64, copy=False)


def _hnsw_parameters(index, k: int, ef_search: int | None):
    """Per-call efSearch (at least k) for an HNSW index, float or binary; None otherwise."""
    if not isinstance(index, (faiss.IndexHNSW, faiss.IndexBinaryHNSW)):
        return None
    return faiss.SearchParametersHNSW(efSearch=max(k, ef_search or index.hnsw.efSearch))


def _search_binary(
    index, queries: np.ndarray, k: int, ef_search: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """The query's sign bits find RESCORE_CANDIDATES × k rows by Hamming distance; each is
    rescored with the float query against the row's ±1 vector, and the k best by that score
    are kept (equal scores: the lower row first, as the exact scan orders them)."""
    q, rows_in_shard, dim = len(queries), index.ntotal, index.d
    scores_out = np.full((q, k), -np.inf, dtype=np.float32)
    rows_out = np.full((q, k), -1, dtype=np.int64)
    wanted = min(rows_in_shard, RESCORE_CANDIDATES * k)
    if wanted == 0 or q == 0:
        return scores_out, rows_out
    bits = np.packbits(queries > 0, axis=1)  # (q, dim/8), as quantize_embeddings packs rows
    _, candidates = index.search(bits, wanted, params=_hnsw_parameters(index, wanted, ef_search))
    codes = index.reconstruct_n(0, rows_in_shard)  # (rows, dim/8): the shard's bits
    take = min(k, wanted)
    step = max(1, RESCORE_BLOCK // (wanted * dim))
    for start in range(0, q, step):
        found = candidates[start : start + step].astype(np.int64)  # (b, wanted), −1: none
        vectors = sign_vectors(codes[np.maximum(found, 0).reshape(-1)], dim)
        vectors = vectors.reshape(len(found), wanted, dim)
        scores = np.einsum("bd,bwd->bw", queries[start : start + step], vectors)
        scores[found < 0] = -np.inf
        # Best first, then the lower row: lexsort's last key is the primary one.
        order = np.lexsort((found, -scores), axis=1)[:, :take]
        scores_out[start : start + step, :take] = np.take_along_axis(scores, order, axis=1)
        rows_out[start : start + step, :take] = np.take_along_axis(found, order, axis=1)
    rows_out[np.isneginf(scores_out)] = -1
    return scores_out, rows_out


def _info_json(info: IndexInfo) -> str:
    tree = dataclasses.asdict(info)
    tree.pop("location")  # OUT may move (copied to a bucket): the entries are relative to it
    return json.dumps({"format": INDEX_FORMAT, **tree}, indent=2) + "\n"
