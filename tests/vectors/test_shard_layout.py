"""Reading the embedding layout: manifests and shards as the embed job writes them, and every
way they can be missing or malformed named by file."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from embedding_outputs import unit, write_embedding_output

from distributed_emb.vectors.shard_layout import (
    ShardLayoutError,
    dequantize_int8,
    iter_shards,
    read_manifest,
    read_shard,
    unit_vectors,
)


@pytest.fixture
def output(tmp_path):
    rng = np.random.default_rng(0)
    vectors = unit(rng.normal(size=(10, 8)))
    texts = [f"sentence {i}" for i in range(10)]
    write_embedding_output(tmp_path, vectors, texts=texts, documents=np.arange(10) // 3)
    return tmp_path, vectors


def test_shards_come_back_in_order_with_their_columns(output):
    out, vectors = output
    manifest = read_manifest(str(out))
    assert (manifest.dim, manifest.rows, len(manifest.shards)) == (8, 10, 3)
    shards = list(iter_shards(manifest, ["id", "embedding", "text", "document"]))
    assert np.array_equal(np.concatenate([s.ids for s in shards]), np.arange(10) * 10 + 7)
    assert np.array_equal(np.concatenate([s.embeddings for s in shards]), vectors)
    assert [t for s in shards for t in s.text] == [f"sentence {i}" for i in range(10)]
    assert np.array_equal(np.concatenate([s.document for s in shards]), np.arange(10) // 3)


def test_optional_columns_absent_come_back_none(tmp_path):
    write_embedding_output(tmp_path, unit(np.ones((4, 8))))
    shard = read_shard(read_manifest(str(tmp_path)), 0, ["id", "embedding", "text", "document"])
    assert shard.text is None and shard.document is None and len(shard.ids) == 2


def _edit_manifest(out, **changes):
    tree = json.loads((out / "manifest.json").read_text())
    for key, value in changes.items():
        if value is None:
            tree.pop(key)
        else:
            tree[key] = value
    (out / "manifest.json").write_text(json.dumps(tree))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"dim": None}, "manifest.json: dim: missing"),
        ({"dim": "8"}, "manifest.json: dim: must be int, got '8'"),
        ({"rows": 11}, "manifest.json: rows: 11, but the shards hold 10"),
        ({"format": 2}, "manifest.json: format: 2 is not a format this version reads"),
        ({"dtype": "float16"}, "manifest.json: dtype: must be one of"),
        ({"shards": [{"file": "x.parquet", "rows": 10}]}, "shards[0].first_id: missing"),
        ({"max_seq_length": "128"}, "manifest.json: max_seq_length: must be int, got '128'"),
    ],
)
def test_a_malformed_manifest_is_named_with_its_key(output, changes, message):
    out, _ = output
    _edit_manifest(out, **changes)
    with pytest.raises(ShardLayoutError, match=message.replace("[", r"\[").replace("]", r"\]")):
        read_manifest(str(out))


def test_a_missing_or_broken_manifest_names_the_file(tmp_path):
    with pytest.raises(ShardLayoutError, match=rf"{tmp_path}/manifest.json: missing"):
        read_manifest(str(tmp_path))
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ShardLayoutError, match="manifest.json: not valid JSON"):
        read_manifest(str(tmp_path))


def test_a_missing_or_broken_shard_names_the_file(output):
    out, _ = output
    manifest = read_manifest(str(out))
    first, second = (out / manifest.shards[i].file for i in (0, 1))
    first.unlink()
    with pytest.raises(ShardLayoutError, match=rf"{first}: missing \(listed in"):
        read_shard(manifest, 0)
    second.write_bytes(b"not parquet")
    with pytest.raises(ShardLayoutError, match=rf"{second}: not a readable Parquet file"):
        read_shard(manifest, 1)


def test_a_shard_that_disagrees_with_the_manifest_is_named(output):
    out, _ = output
    manifest = read_manifest(str(out))
    path = out / manifest.shards[2].file
    table = pq.read_table(path)
    narrow = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(len(table) * 4, np.float32)), 4)
    pq.write_table(table.set_column(1, "embedding", narrow), path)
    with pytest.raises(ShardLayoutError, match=r"part-000000000077.parquet: embedding: .*dim 8"):
        read_shard(manifest, 2)
    pq.write_table(table.slice(0, 2), path)
    with pytest.raises(ShardLayoutError, match=r"2 rows, but .*manifest.json lists 3"):
        read_shard(manifest, 2)
    pq.write_table(table.take([1, 0, 2]), path)
    with pytest.raises(ShardLayoutError, match="ids are not sorted and unique"):
        read_shard(manifest, 2)


def test_int8_output_comes_back_within_half_a_step_of_the_vectors(tmp_path):
    rng = np.random.default_rng(1)
    vectors = unit(rng.normal(size=(60, 16)))
    write_embedding_output(tmp_path, vectors, dtype="int8")
    manifest = read_manifest(str(tmp_path))
    shard = read_shard(manifest, 0)
    assert shard.embeddings.dtype == np.int8
    ranges = np.stack([vectors.min(axis=0), vectors.max(axis=0)])
    step = (ranges[1] - ranges[0]) / 255
    restored = dequantize_int8(shard.embeddings, ranges)
    assert np.all(np.abs(restored - vectors[: len(restored)]) <= step / 2 + 1e-6)
    # Unit length again, and close to the float vectors they came from.
    units = unit_vectors(shard, manifest)
    assert np.allclose(np.linalg.norm(units, axis=1), 1.0, atol=1e-6)
    assert np.min(np.sum(units * vectors[: len(units)], axis=1)) > 0.99


def test_int8_output_without_its_calibration_names_the_file(tmp_path):
    write_embedding_output(tmp_path, unit(np.eye(8)), dtype="int8")
    (tmp_path / "calibration.npy").unlink()
    manifest = read_manifest(str(tmp_path))
    with pytest.raises(ShardLayoutError, match=r"calibration.npy: missing"):
        unit_vectors(read_shard(manifest, 0), manifest)


def test_vectors_written_unnormalised_come_back_unit_length(tmp_path):
    vectors = np.random.default_rng(2).normal(size=(6, 8)) * 3
    write_embedding_output(tmp_path, vectors, normalized=False)
    manifest = read_manifest(str(tmp_path))
    units = unit_vectors(read_shard(manifest, 0), manifest)
    assert np.allclose(units, unit(vectors[:2]), atol=1e-6)
