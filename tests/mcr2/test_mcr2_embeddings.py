"""Frozen-encoder embeddings: computed once, cached on disk, invalidated when inputs change."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from distributed_emb.mcr2.embeddings import CachedEncoder, EncoderConfig, texts_hash

SENTENCES = [
    "A man is playing a guitar.",
    "The cat sits on the mat.",
    "Stocks fell sharply on Monday.",
    "A woman is slicing an onion.",
    "Rain is expected tomorrow.",
]


class CountingEncoder:
    """A deterministic stand-in encoder that records what it was asked to embed."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.calls.append(list(texts))
        return np.array([[len(t), t.count("a"), hash(t) % 97] for t in texts], dtype=np.float32)


def _config(tmp_path, model_path, **kwargs) -> EncoderConfig:
    return EncoderConfig(path=model_path, cache_dir=str(tmp_path / "cache"), **kwargs)


def test_texts_are_embedded_once_and_reread_from_disk(tmp_path, tiny_bert_path):
    fake = CountingEncoder()
    encoder = CachedEncoder(_config(tmp_path, tiny_bert_path), encode=fake)
    first = encoder(SENTENCES + SENTENCES[:2])  # duplicates are embedded once
    assert fake.calls == [SENTENCES]
    np.testing.assert_array_equal(first[5:], first[:2])
    encoder(SENTENCES[1:3])  # all in memory
    assert len(fake.calls) == 1 and encoder.stats["memory_hits"] == 1

    later = CountingEncoder()
    reopened = CachedEncoder(_config(tmp_path, tiny_bert_path), encode=later)
    np.testing.assert_array_equal(reopened(SENTENCES + SENTENCES[:2]), first)
    assert later.calls == [] and reopened.stats["disk_hits"] == 1

    manifests = [json.loads(p.read_text()) for p in (tmp_path / "cache").glob("*.json")]
    assert len(manifests) == 1
    assert manifests[0]["texts_sha256"] == texts_hash(SENTENCES)
    assert manifests[0]["pooler"] == "mean" and manifests[0]["shape"] == [5, 3]


def test_only_missing_texts_are_encoded(tmp_path, tiny_bert_path):
    fake = CountingEncoder()
    encoder = CachedEncoder(_config(tmp_path, tiny_bert_path), encode=fake)
    encoder(SENTENCES[:3])
    encoder(SENTENCES)
    assert fake.calls == [SENTENCES[:3], SENTENCES[3:]]


def test_changed_pooler_or_model_files_invalidate_the_cache(tmp_path, tiny_bert_path):
    CachedEncoder(_config(tmp_path, tiny_bert_path), encode=CountingEncoder())(SENTENCES)

    other_pooler = CountingEncoder()
    config = _config(tmp_path, tiny_bert_path, pooler="cls_before_pooler")
    CachedEncoder(config, encode=other_pooler)(SENTENCES)
    assert other_pooler.calls == [SENTENCES]

    # A model retrained into the same directory: a file's content changes (restored after).
    config_file = Path(tiny_bert_path) / "config.json"
    saved = config_file.read_bytes()
    stat = config_file.stat()
    try:
        config_file.write_bytes(saved + b"\n")
        retrained = CountingEncoder()
        CachedEncoder(_config(tmp_path, tiny_bert_path), encode=retrained)(SENTENCES)
        assert retrained.calls == [SENTENCES]
    finally:
        config_file.write_bytes(saved)
        os.utime(config_file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    # Touched but unchanged: the same model, still cached.
    os.utime(config_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    try:
        touched = CountingEncoder()
        CachedEncoder(_config(tmp_path, tiny_bert_path), encode=touched)(SENTENCES)
        assert touched.calls == []
    finally:
        os.utime(config_file, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_a_damaged_cache_entry_is_recomputed(tmp_path, tiny_bert_path):
    CachedEncoder(_config(tmp_path, tiny_bert_path), encode=CountingEncoder())(SENTENCES)
    (npy,) = (tmp_path / "cache").glob("*.npy")
    np.save(npy, np.zeros((2, 3), dtype=np.float32))  # wrong number of rows
    again = CountingEncoder()
    CachedEncoder(_config(tmp_path, tiny_bert_path), encode=again)(SENTENCES)
    assert again.calls == [SENTENCES]


@pytest.mark.ray
def test_ray_actor_embeddings_equal_in_process_ones(tmp_path, tiny_bert_path, ray_local):
    from distributed_emb.model.embedder import local_encode

    config = _config(tmp_path, tiny_bert_path, use_ray=True, batch_size=2, max_seq_length=32)
    encoder = CachedEncoder(config)
    got = encoder(SENTENCES)
    expected = local_encode(
        SENTENCES, tiny_bert_path, pooler="mean", batch_size=2, max_seq_length=32
    )
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert encoder.stats["encoded_texts"] == len(SENTENCES)


def test_dropout_views_differ_from_each_other_and_are_cached(tmp_path, tiny_bert_path):
    from distributed_emb.model.embedder import local_encode

    config = _config(tmp_path, tiny_bert_path, use_ray=False, max_seq_length=32)
    encoder = CachedEncoder(config)
    view1, view2 = encoder.dropout_views(SENTENCES, seed=0)
    plain = local_encode(SENTENCES, tiny_bert_path, pooler="mean", max_seq_length=32)
    assert view1.shape == view2.shape == plain.shape
    assert not np.allclose(view1, view2)  # dropout was on
    assert not np.allclose(view1, plain)

    def cos(a, b):
        return np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)

    assert (cos(view1, plain) > 0.8).all()  # a perturbation of the sentence, not noise
    again = CachedEncoder(config)
    cached1, cached2 = again.dropout_views(SENTENCES, seed=0)
    np.testing.assert_array_equal(cached1, view1)
    np.testing.assert_array_equal(cached2, view2)
    assert again.stats["encoded_texts"] == 0
