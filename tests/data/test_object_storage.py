"""Object storage for real, on loopback: the corpus is read from an S3 bucket as shards, its
token shards are built and committed there, Ray Train keeps its checkpoints there, and the
exported model lands beside them, readable by a process that was never part of the cluster."""

import gzip
import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from distributed_emb.config import TrainingConfig, load_config
from distributed_emb.paths import shipped_corpus


def _upload_corpus_shards(bucket: str, lines: list[str]) -> None:
    filesystem, root = pafs.FileSystem.from_uri(f"{bucket}/corpus")
    half = len(lines) // 2
    pq.write_table(
        pa.table({"text": lines[:half]}), f"{root}/part-0.parquet", filesystem=filesystem
    )
    with filesystem.open_output_stream(f"{root}/more/part-1.jsonl.gz", compression=None) as handle:
        handle.write(
            gzip.compress("\n".join(json.dumps({"text": t}) for t in lines[half:]).encode())
        )


@pytest.mark.slow
@pytest.mark.ray
def test_training_reads_and_writes_s3(s3, ray_local, tmp_path, tiny_bert_path):
    from harness.tiny_run import tiny_config

    from distributed_emb.train.driver import run_training

    bucket = s3.create_bucket("distributed-emb-test")
    lines = open(shipped_corpus("wiki_sentences.txt")).read().splitlines()[:200]
    _upload_corpus_shards(bucket, lines)
    config = tiny_config(
        tiny_bert_path,
        f"{bucket}/corpus/",
        tmp_path / "run",
        "data.max_rows=null",
        "train.max_steps=2",
        "eval.eval_steps=2",
        f"output.storage_path={bucket}/runs",
        "output.run_name=s3-run",
    )
    metrics = run_training(config).metrics

    assert metrics["steps"] == 2
    assert metrics["corpus"]["read"] == metrics["corpus"]["kept"] == 200  # both shards read
    keys = s3.keys("distributed-emb-test", "runs/s3-run/")
    assert any("/checkpoint_" in key for key in keys)
    assert "runs/s3-run/model/modules.json" in keys and "runs/s3-run/metrics.json" in keys
    assert metrics["model_uri"] == f"{bucket}/runs/s3-run/model"
    # The run trained from token shards it built on the storage path (the one data path).
    cache = s3.keys("distributed-emb-test", "runs/token_cache/")
    assert any(key.endswith("/COMMIT.json") for key in cache), cache

    # A fresh interpreter, outside Ray, fetches the model from the bucket and loads it.
    script = f"""
import pyarrow.fs as pafs
from sentence_transformers import SentenceTransformer
fs, root = pafs.FileSystem.from_uri({metrics["model_uri"]!r})
pafs.copy_files(root, {str(tmp_path / "fetched")!r}, source_filesystem=fs)
print(SentenceTransformer({str(tmp_path / "fetched")!r}, device="cpu").encode(["x"]).shape)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith(")")


@pytest.mark.ray
def test_shards_on_object_storage_are_committed_and_reused(s3, ray_local, tmp_path, tiny_bert_path):
    """The cache on an s3:// root: built once, committed by one object, reused by the next run
    with the same key (what a Tune search or a resumed run on a cluster does)."""
    from distributed_emb.data.indexed_shards import ShardReader
    from distributed_emb.data.readers import ROW_ID
    from distributed_emb.data.token_cache import COMMIT_FILE, token_shards

    bucket = s3.create_bucket("distributed-emb-token-cache")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "\n".join(open(shipped_corpus("wiki_sentences.txt")).read().splitlines()[:80])
    )
    config = load_config(
        TrainingConfig,
        None,
        [
            f"model.path={tiny_bert_path}",
            f"data.path={corpus}",
            f"data.token_cache_dir={bucket}/cache",
        ],
    )

    shards = token_shards(config.data, config.stream_settings())
    assert shards.built and shards.rows == 80 and shards.directory.startswith(f"{bucket}/cache/")
    keys = s3.keys("distributed-emb-token-cache", "cache/")
    (commit,) = [key for key in keys if key.endswith(f"/{COMMIT_FILE}")]
    data_keys = [key for key in keys if "/data-" in key and key.endswith(".arrow")]
    assert data_keys and all(key.startswith(commit.rsplit("/", 1)[0]) for key in data_keys)

    again = token_shards(config.data, config.stream_settings())
    assert not again.built and again.directory == shards.directory and again.rows == 80
    assert s3.keys("distributed-emb-token-cache", "cache/") == keys  # nothing written again
    # A rank reads the shards through its node's local copies, in the order asked.
    reader = ShardReader(again.index, cache_dir=str(tmp_path / "node_cache"))
    rows = reader.take(np.arange(80)[::-1]).column(ROW_ID).to_pylist()
    assert len(set(rows)) == 80 and len(list((tmp_path / "node_cache").glob("*.arrow"))) == len(
        again.index.shards
    )
    assert rows == ShardReader(shards.index).take(np.arange(80)[::-1]).column(ROW_ID).to_pylist()
