"""Embedding outputs for the index, search and mining tests, written in the layout the embed
job writes (manifest.json, shards/part-<first_id>.parquet, calibration.npy), and the one real
corpus of the test session embedded with the packaged MiniLM.

A plain module, not a conftest.py: a conftest here would become the `conftest` module the
suite's runtime `from conftest import build_tiny_bert` finds (pytest clears and reloads that
name for each directory's conftest). The embedding is cached per process instead of in a
session fixture: every test module that asks for it gets the same arrays, computed once.
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

# Rows of the shipped news corpus embedded once per test process, three shards of ~667 rows:
# 2,000 sentences took 27 s of CPU time (about 14 s on 2 idle cores; 80 s of wall time on a
# 2-core machine at load average 10).
NEWS_ROWS = 2000


def write_embedding_output(
    out: Path,
    vectors: np.ndarray,
    texts: list[str] | None = None,
    documents: np.ndarray | None = None,
    ids: np.ndarray | None = None,
    shards: int = 3,
    normalized: bool = True,
    dtype: str = "float32",
    model: str = "unused-model",
) -> Path:
    """`vectors` (n, d) cut into `shards` consecutive shards, written as the embed job writes
    them. ids default to 10·row + 7 (not positions, so a mix-up of the two shows); int8
    quantises with sentence-transformers over the whole set and writes the calibration;
    ubinary packs the signs with sentence-transformers."""
    n, dim = vectors.shape
    ids = np.arange(n, dtype=np.int64) * 10 + 7 if ids is None else np.asarray(ids, np.int64)
    stored = vectors.astype(np.float32)
    value_type = pa.float32()
    if dtype == "int8":
        from sentence_transformers.util.quantization import quantize_embeddings

        ranges = np.stack([vectors.min(axis=0), vectors.max(axis=0)]).astype(np.float32)
        stored = quantize_embeddings(vectors, precision="int8", ranges=ranges)
        value_type = pa.int8()
        np.save(out / "calibration.npy", ranges)
    width = dim
    if dtype == "ubinary":
        from sentence_transformers.util.quantization import quantize_embeddings

        stored = quantize_embeddings(vectors, precision="ubinary")  # (n, dim/8) bits
        value_type, width = pa.uint8(), dim // 8
    (out / "shards").mkdir(parents=True, exist_ok=True)
    entries = []
    for rows in np.array_split(np.arange(n), shards):
        file = f"shards/part-{ids[rows[0]]:012d}.parquet"
        flat = pa.array(stored[rows].reshape(-1), type=value_type)
        columns = {
            "id": pa.array(ids[rows], pa.int64()),
            "embedding": pa.FixedSizeListArray.from_arrays(flat, width),
        }
        if texts is not None:
            columns["text"] = pa.array([texts[i] for i in rows], pa.string())
        if documents is not None:
            columns["document"] = pa.array(np.asarray(documents)[rows], pa.int64())
        pq.write_table(pa.table(columns), out / file)
        entries.append({"file": file, "first_id": int(ids[rows[0]]), "rows": len(rows)})
    manifest = {
        "format": 1,
        "model": model,
        "dim": dim,
        "normalized": normalized,
        "dtype": dtype,
        "rows": n,
        "shards": entries,
        "dropped": {},
        "corpus": ["corpus.jsonl"],
    }
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def unit(vectors: np.ndarray) -> np.ndarray:
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


@functools.cache
def embedded_news(model_path: str) -> tuple[list[str], np.ndarray, float]:
    """(texts, (n, 384) unit vectors, seconds the embedding took) of the first NEWS_ROWS rows
    of the shipped news corpus, embedded once per process with the model at `model_path`."""
    from distributed_emb.model.embedder import Embedder
    from distributed_emb.paths import shipped_news_retrieval_dir

    corpus = Path(shipped_news_retrieval_dir()) / "corpus.jsonl"
    with corpus.open(encoding="utf-8") as lines:
        texts = [json.loads(line)["text"] for _, line in zip(range(NEWS_ROWS), lines)]
    start = time.perf_counter()
    vectors = Embedder(model_path).embed(texts)
    return texts, vectors, time.perf_counter() - start


def write_news_output(out: Path, model_path: str) -> Path:
    """The embedded news rows as an embedding output in 3 shards, with text and `model_path`
    as the manifest's model; no index."""
    texts, vectors, _ = embedded_news(model_path)
    return write_embedding_output(out, vectors, texts=texts, model=model_path)
