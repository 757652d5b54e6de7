"""Tokenised shards (data/token_cache.py), the one form every corpus is trained from: equal to the
collator's ids, each line read once by the build, keyed so that a different corpus, tokenizer or
maximum length never reuses them, committed atomically, and read back by a restarted worker and
by a resumed run. The keys that chose another data path are refused, saying why."""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from transformers import AutoTokenizer

from distributed_emb.checks import ConfigError
from distributed_emb.config import TrainingConfig, from_dict, load_config
from distributed_emb.data import token_cache
from distributed_emb.data.batches import numpy_batch
from distributed_emb.data.collate import ContrastiveCollator
from distributed_emb.data.indexed_shards import LENGTH, ShardReader
from distributed_emb.data.readers import ROW_ID, DropReport
from distributed_emb.data.token_cache import (
    COMMIT_FILE,
    TokenCacheError,
    cache_key,
    key_id,
    searched_key_settings,
    token_shards,
)
from distributed_emb.paths import shipped_corpus

MAX_LEN = 12  # short enough that some shipped sentences are cut


def _corpus(directory: Path, lines: int = 300) -> Path:
    texts = open(shipped_corpus("wiki_sentences.txt")).read().splitlines()[:lines]
    path = directory / "corpus.txt"
    path.write_text("\n".join(texts + ["", "   "]) + "\n")  # two blank lines: dropped, counted
    return path


def _config(corpus: Path, tokenizer: str, cache: Path, *overrides: str) -> TrainingConfig:
    return load_config(
        TrainingConfig,
        None,
        [
            f"model.path={tokenizer}",
            f"model.max_seq_length={MAX_LEN}",
            f"data.path={corpus}",
            f"data.token_cache_dir={cache}",
            *overrides,
        ],
    )


def _key(config) -> str:
    return key_id(cache_key(config.data, config.stream_settings()))


def _data_dirs(cache: Path) -> list[Path]:
    return sorted(cache.glob("*/data-*"))


# --- the key, without Ray -----------------------------------------------------------------------


def test_the_key_changes_with_max_length_tokenizer_and_corpus(tmp_path, tiny_bert_path):
    corpus = _corpus(tmp_path)
    tokenizer_dir = tmp_path / "tok"
    shutil.copytree(tiny_bert_path, tokenizer_dir)
    base = _key(_config(corpus, tokenizer_dir, tmp_path / "c"))
    assert base == _key(_config(corpus, tokenizer_dir, tmp_path / "c"))
    # Settings applied when the shards are read do not split the cache.
    same = _config(
        corpus, tokenizer_dir, tmp_path / "c", "data.shuffle_seed=7", "train.batch_size=4"
    )
    assert _key(same) == base

    longer = _config(corpus, tokenizer_dir, tmp_path / "c", f"model.max_seq_length={MAX_LEN + 1}")
    assert _key(longer) != base
    cleaned = _config(corpus, tokenizer_dir, tmp_path / "c", "data.max_chars=50")
    assert _key(cleaned) != base

    # Another tokenizer at the same path (one added token): its ids may differ, so a new key.
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.add_tokens(["zzqxtoken"])
    tokenizer.save_pretrained(tokenizer_dir)
    retokenised = _key(_config(corpus, tokenizer_dir, tmp_path / "c"))
    assert retokenised != base

    # The corpus rewritten (other size, newer time): a new key.
    corpus.write_text(corpus.read_text() + "One more sentence.\n")
    os.utime(corpus, ns=(corpus.stat().st_atime_ns, corpus.stat().st_mtime_ns + 10**9))
    assert _key(_config(corpus, tokenizer_dir, tmp_path / "c")) != retokenised


@pytest.mark.parametrize("key", ["data.token_cache", "data.tokenize_in"])
@pytest.mark.parametrize("value", ["off", "on", "auto", "worker"])
def test_the_keys_of_the_removed_data_path_are_refused_saying_why(key, value):
    with pytest.raises(ConfigError, match=rf"^{key} was removed: .*every corpus is now read once "
                       r"into indexed token shards .*delete the key"):  # fmt: skip
        load_config(TrainingConfig, None, [f"{key}={value}"])
    tree = {"data": {key.split(".")[1]: value}}
    with pytest.raises(ConfigError, match=rf"^{key} was removed"):  # a YAML file's key too
        from_dict(TrainingConfig, tree)


def test_a_search_that_varies_what_the_ids_depend_on_does_not_share_one_build():
    space = {"train.learning_rate": None, "loss.temperature": None}
    assert searched_key_settings(space) == []
    space.update({"model.max_seq_length": None, "data.max_chars": None})
    assert searched_key_settings(space) == ["model.max_seq_length", "data.max_chars"]


def test_a_broken_commit_is_refused_naming_the_file(tmp_path):
    (tmp_path / COMMIT_FILE).write_text("{not json")
    with pytest.raises(TokenCacheError, match=rf"{COMMIT_FILE}: not a token-cache commit"):
        token_cache.committed_shards(str(tmp_path))
    (tmp_path / COMMIT_FILE).write_text(
        json.dumps({"data": "../x", "shards": [], "corpus": DropReport().as_dict()})
    )
    with pytest.raises(TokenCacheError, match="must name a data-"):
        token_cache.committed_shards(str(tmp_path))


# --- building and reading, on a local Ray -------------------------------------------------------


def _text_by_row_id(config) -> dict[int, str]:
    """The clean corpus as the build reads it, before tokenising: {row id: text}."""
    from distributed_emb.data.corpus import start_drop_counter
    from distributed_emb.data.corpus_dataset import training_dataset

    rows = training_dataset(config.data, start_drop_counter()).take_all()
    return {row[ROW_ID]: row["text"] for row in rows}


@pytest.mark.ray
def test_shards_equal_the_collator_and_are_reused(
    ray_local, tmp_path, tiny_bert_path, monkeypatch, caplog
):
    import logging

    import ray

    from distributed_emb.progress_report import polled_progress

    corpus, cache = _corpus(tmp_path), tmp_path / "cache"
    config = _config(corpus, tiny_bert_path, cache)
    read, original = [], token_cache.collect_report

    def collect_report(counter):  # the build's counter: every line it read, re-reads included
        read.append(ray.get(counter.rows_read.remote()))
        return original(counter)

    def progress_lines(*args, **kwargs):  # off a terminal, with a line for every poll
        return polled_progress(*args, **kwargs, every_s=0.2, mode="lines", line_every_s=0)

    monkeypatch.setattr(token_cache, "collect_report", collect_report)
    monkeypatch.setattr(token_cache, "polled_progress", progress_lines)
    caplog.set_level(logging.INFO, logger="distributed_emb.progress_report")
    shards = token_shards(config.data, config.stream_settings())
    assert shards.built and shards.rows == 300
    assert shards.report.kept == 300 and shards.report.dropped == {"empty": 2}
    assert read == [302]  # each line of the corpus read once by the build
    # The build's progress is that count: its closing line has every line read.
    said = [r.getMessage() for r in caplog.records if r.name.endswith("progress_report")]
    assert said and said[-1].startswith("token cache: rows read: 302 rows in"), said
    # In corpus order: a row's place in the shards is its place among the clean lines.
    in_order = ShardReader(shards.index).take(np.arange(300), columns=[ROW_ID])
    assert in_order.column(ROW_ID).to_pylist() == sorted(in_order.column(ROW_ID).to_pylist())
    assert len(_data_dirs(cache)) == 1

    # Every cached row: the ids and mask the worker-side collator makes from its text.
    rows = _all_rows(shards)
    assert len(rows) == 300 and "text" not in rows[0]
    assert all(r[LENGTH] == len(r["text__ids"]) for r in rows)  # what length grouping reads
    text = _text_by_row_id(config)
    assert sorted(text) == sorted(r[ROW_ID] for r in rows)
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_path)
    collate = ContrastiveCollator(tokenizer, MAX_LEN)
    for start in range(0, 300, 64):
        chunk = rows[start : start + 64]
        cached = collate(numpy_batch(pa.Table.from_pylist(chunk)))  # as a rank hands its slice
        worker = collate({"text": np.array([text[r[ROW_ID]] for r in chunk], dtype=object)})
        for key in ("input_ids", "attention_mask", "num_truncated"):
            assert torch.equal(cached[key], worker[key]), key
    assert sum(r["text__truncated"] for r in rows) > 0  # MAX_LEN cuts some: the flag is real

    # The same key again: reused, nothing tokenised.
    again = token_shards(config.data, config.stream_settings())
    assert not again.built and again.directory == shards.directory and again.rows == 300
    assert again.report.as_dict() == shards.report.as_dict()
    assert len(_data_dirs(cache)) == 1

    # Another maximum length never reuses them: a second build under its own key.
    longer = _config(corpus, tiny_bert_path, cache, f"model.max_seq_length={MAX_LEN * 2}")
    other = token_shards(longer.data, longer.stream_settings())
    assert other.built and Path(other.directory).parent != Path(shards.directory).parent
    assert len(_data_dirs(cache)) == 2


@pytest.mark.ray
def test_a_writer_that_dies_before_its_commit_is_never_reused(
    ray_local, tmp_path, tiny_bert_path, monkeypatch
):
    corpus, cache = _corpus(tmp_path, lines=80), tmp_path / "cache"
    config = _config(corpus, tiny_bert_path, cache)

    def crash(counter):
        raise KeyboardInterrupt("killed after the shards, before the commit")

    monkeypatch.setattr(token_cache, "collect_report", crash)
    with pytest.raises(KeyboardInterrupt):
        token_shards(config.data, config.stream_settings())
    (half,) = _data_dirs(cache)  # shards on disk, but no commit names them
    assert not (half.parent / COMMIT_FILE).exists()
    monkeypatch.undo()

    shards = token_shards(config.data, config.stream_settings())
    assert shards.built and Path(shards.directory) != half and shards.rows == 80


@pytest.mark.ray
def test_a_restarted_group_reads_the_rest_of_its_epoch_from_the_shards(
    ray_local, tmp_path, tiny_bert_path
):
    from distributed_emb.data.epoch_plan import BatchPlan, DataPosition
    from distributed_emb.data.rank_batches import IndexedSource, RankBatches

    corpus, cache = _corpus(tmp_path), tmp_path / "cache"
    config = _config(corpus, tiny_bert_path, cache)
    shards = token_shards(config.data, config.stream_settings())
    source, plan = IndexedSource(shards.index), BatchPlan(global_batch=16, seed=3)
    epoch = list(RankBatches(source, plan, 0, 1).epoch(DataPosition()))
    ids = [r for batch, _ in epoch for r in batch.column(ROW_ID).to_pylist()]
    assert len(ids) == len(set(ids)) and 300 - len(ids) < 16  # all but a last partial batch
    assert "text__ids" in epoch[0][0].column_names  # token ids reach the ranks, no text
    # Restarted on two ranks after 5 global batches: exactly the rest of the epoch.
    ranks = [RankBatches(source, plan, r, 2).epoch(epoch[4][1]) for r in range(2)]
    rest = [sum((t.column(ROW_ID).to_pylist() for t, _ in pair), []) for pair in zip(*ranks)]
    assert rest == [b.column(ROW_ID).to_pylist() for b, _ in epoch[5:]]


def _all_rows(shards) -> list[dict]:
    return ShardReader(shards.index).take(np.arange(shards.rows)).to_pylist()
