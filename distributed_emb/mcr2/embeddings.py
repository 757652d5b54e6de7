"""Frozen-encoder embeddings, computed once (Ray Data actors) and cached on disk.

The MCR² head trains on vectors, not text: every sentence the run needs (training sentences,
pairs, evaluation sets) is embedded once by the frozen encoder and kept

- in memory by :class:`CachedEncoder` (text → vector, so the baselines and every head reuse
  the same full-size vectors), and
- on disk as ``<cache_dir>/<key>.npy`` plus ``<key>.json``, a small manifest. The key hashes
  the model (its path and a digest of its files, model/model_fingerprint.py, so retraining
  into the same directory invalidates the cache), the pooler, the max sequence length, the
  kind of embedding (plain or a dropout view) and the texts themselves.

Dropout views (two encodes with dropout on, for the pair term when no pairs file exists) run
in this process: the shared Ray path (``model/embedder.py``) goes through
``SentenceTransformer.encode``, which always switches the model to eval mode.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import torch
from pydantic import Field

from distributed_emb.model.embedder import make_encoder, use_encoding_pool
from distributed_emb.model.model_fingerprint import model_fingerprint
from distributed_emb.model.sentence_transformer import load_sentence_transformer
from distributed_emb.paths import default_model_path
from distributed_emb.settings import section

log = logging.getLogger(__name__)

CACHE_FORMAT_VERSION = 1


@section
class EncoderConfig:
    path: Annotated[
        str | None,
        Field(
            description="the frozen encoder: a Hugging Face or sentence-transformers directory, "
            "or a hub name; null: the packaged all-MiniLM-L6-v2"
        ),
    ] = None
    pooler: Annotated[
        Literal["cls", "cls_before_pooler", "mean"] | None,
        Field(
            description="the sentence vector (our pooler names); null: read model.path as a "
            "sentence-transformers directory as saved"
        ),
    ] = "mean"
    max_seq_length: Annotated[
        int | None, Field(ge=4, description="tokens per sentence; null: the model's own limit")
    ] = 128
    batch_size: Annotated[int, Field(ge=1, description="sentences per encoding batch")] = 128
    # model/embedder.py use_encoding_pool.
    use_ray: Annotated[
        bool | Literal["auto"],
        Field(
            description="encode in a Ray Data actor pool; auto: when joining a cluster or "
            "model.concurrency > 1, else in this process with the same model and batching"
        ),
    ] = "auto"
    concurrency: Annotated[int, Field(ge=1, description="encoding actors")] = 1
    # Ray would give a 1-CPU actor one thread.
    torch_threads: Annotated[
        int | None, Field(ge=1, description="threads per encoding actor; null: Ray's choice")
    ] = None
    cache_dir: Annotated[
        str, Field(description="where the frozen encoder's embeddings are cached")
    ] = "outputs/embedding_cache"

    def model_path(self) -> str:
        if self.path is not None:
            return self.path

        return default_model_path()


def texts_hash(texts: Sequence[str]) -> str:
    """sha256 of the texts in order (NUL-separated, so ["ab"] and ["a", "b"] differ)."""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()


class EmbeddingCache:
    """``<key>.npy`` + ``<key>.json`` files in one directory; writes are atomic renames."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)

    def key(self, manifest: dict) -> str:
        return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:24]

    def load(self, key: str, num_rows: int) -> np.ndarray | None:
        """The cached (num_rows, d) array, or None when absent, unreadable or mis-shaped."""
        array_path = self.directory / f"{key}.npy"
        manifest_path = self.directory / f"{key}.json"
        if not (array_path.is_file() and manifest_path.is_file()):
            return None
        try:
            manifest = json.loads(manifest_path.read_text())
            array = np.load(array_path)
        except (OSError, ValueError) as error:
            log.warning("embedding cache %s unreadable (%s); recomputing", array_path, error)
            return None
        if (
            array.ndim != 2
            or array.shape[0] != num_rows
            or manifest.get("shape") != list(array.shape)
        ):
            log.warning(
                "embedding cache %s holds shape %s, expected %d rows; recomputing",
                array_path,
                array.shape,
                num_rows,
            )
            return None
        return array

    def save(self, key: str, array: np.ndarray, manifest: dict) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        array_path = self.directory / f"{key}.npy"
        tmp = self.directory / f".{key}.{os.getpid()}.tmp.npy"
        np.save(tmp, array)
        os.replace(tmp, array_path)
        manifest = {**manifest, "shape": list(array.shape), "dtype": str(array.dtype)}
        tmp_json = self.directory / f".{key}.{os.getpid()}.tmp.json"
        tmp_json.write_text(json.dumps(manifest, indent=1, sort_keys=True))
        os.replace(tmp_json, self.directory / f"{key}.json")
        return array_path


def _encode_function(config: EncoderConfig, model_path: str) -> Callable[[list[str]], np.ndarray]:
    use_ray = use_encoding_pool(config.use_ray, config.concurrency, None)
    ray_options = (
        {"concurrency": config.concurrency, "torch_threads": config.torch_threads}
        if use_ray
        else {}
    )
    return make_encoder(
        model_path,
        pooler=config.pooler,
        batch_size=config.batch_size,
        max_seq_length=config.max_seq_length,
        use_ray=use_ray,
        **ray_options,
    )


def _embed_with_dropout(model, texts: list[str], batch_size: int) -> np.ndarray:
    """(n, d) embeddings with dropout active: ``SentenceTransformer.encode`` switches to eval
    mode, so this runs the modules' forward pass itself, in train mode without gradients."""
    preprocess = getattr(model, "preprocess", None) or model.tokenize  # ST < 6: tokenize
    model.train()
    chunks = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            features = preprocess(texts[start : start + batch_size])
            features = {
                k: v.to(model.device) if hasattr(v, "to") else v for k, v in features.items()
            }
            chunks.append(model(features)["sentence_embedding"].float().cpu().numpy())
    model.eval()
    return np.concatenate(chunks)  # (n, d)


class CachedEncoder:
    """``encode(texts) -> (n, d) float32`` for the frozen encoder, never embedding a text twice.

    Each call looks its unique texts up in memory; if any is missing, the whole call's set is
    looked up on disk, and only then encoded (missing texts only) and saved. ``stats`` counts
    texts encoded, and calls answered from memory and from disk.
    """

    def __init__(
        self,
        config: EncoderConfig,
        encode: Callable[[list[str]], np.ndarray] | None = None,
    ) -> None:
        self.config = config
        self.model_path = config.model_path()
        self.cache = EmbeddingCache(config.cache_dir)
        self._encode = encode  # built lazily: starting Ray is not needed for a warm cache
        self._vectors: dict[str, np.ndarray] = {}
        self._fingerprint = model_fingerprint(self.model_path)
        self.stats = {"encoded_texts": 0, "memory_hits": 0, "disk_hits": 0, "encode_seconds": 0.0}

    def manifest(self, texts: Sequence[str], kind: str = "plain") -> dict:
        return {
            "version": CACHE_FORMAT_VERSION,
            "kind": kind,
            "model_path": str(self.model_path),
            "model_fingerprint": self._fingerprint,
            "pooler": self.config.pooler,
            "max_seq_length": self.config.max_seq_length,
            "texts_sha256": texts_hash(texts),
            "num_texts": len(texts),
        }

    def _encode_texts(self, texts: list[str]) -> np.ndarray:
        if self._encode is None:
            self._encode = _encode_function(self.config, self.model_path)
        start = time.perf_counter()
        vectors = np.asarray(self._encode(texts), dtype=np.float32)  # (n, d)
        self.stats["encode_seconds"] += time.perf_counter() - start
        self.stats["encoded_texts"] += len(texts)
        if vectors.shape[0] != len(texts):
            raise RuntimeError(f"encoder returned {vectors.shape[0]} rows for {len(texts)} texts")
        return vectors

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        texts = [str(t) for t in texts]
        if not texts:
            raise ValueError("no texts to encode")
        unique = list(dict.fromkeys(texts))
        missing = [t for t in unique if t not in self._vectors]
        if not missing:
            self.stats["memory_hits"] += 1
        else:
            manifest = self.manifest(unique)
            key = self.cache.key(manifest)
            stored = self.cache.load(key, len(unique))
            if stored is not None:
                self.stats["disk_hits"] += 1
                self._vectors.update(zip(unique, stored, strict=True))
            else:
                self._vectors.update(zip(missing, self._encode_texts(missing), strict=True))
                manifest["seconds_to_encode_missing"] = round(self.stats["encode_seconds"], 2)
                self.cache.save(key, np.stack([self._vectors[t] for t in unique]), manifest)
        return np.stack([self._vectors[t] for t in texts])  # (n, d)

    def dropout_views(self, texts: Sequence[str], seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Two embeddings of each text with the encoder's dropout on (SimCSE-style views).

        Computed in this process (the Ray path embeds in eval mode) and cached like the rest;
        the views are therefore fixed samples, drawn once per cache key (seed is in the key).
        """
        texts = [str(t) for t in texts]
        manifest = self.manifest(texts, kind=f"dropout-views-seed{seed}")
        key = self.cache.key(manifest)
        stored = self.cache.load(key, 2 * len(texts))
        if stored is not None:
            self.stats["disk_hits"] += 1
            return stored[: len(texts)], stored[len(texts) :]
        model = load_sentence_transformer(
            self.model_path, pooler=self.config.pooler, max_seq_length=self.config.max_seq_length
        )
        torch.manual_seed(seed)
        start = time.perf_counter()
        views = np.concatenate(
            [_embed_with_dropout(model, texts, self.config.batch_size) for _ in range(2)]
        )  # (2n, d)
        self.stats["encode_seconds"] += time.perf_counter() - start
        self.stats["encoded_texts"] += 2 * len(texts)
        self.cache.save(key, views, manifest)
        return views[: len(texts)], views[len(texts) :]
