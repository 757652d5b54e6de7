"""A corpus with a hard-negative column (data.negative_column, as jobs/mine_negatives.py writes
it) through both data paths: read and cleaned like the row's text (a missing or empty negative
is dropped and counted), keyed into the token cache, and reaching the collator as token ids
from the cache's indexed shards and from the streamed feeder alike."""

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoTokenizer

from distributed_emb.checks import ConfigError
from distributed_emb.config import TrainingConfig, load_config
from distributed_emb.data.collate import NEGATIVE_KEYS, ContrastiveCollator
from distributed_emb.data.corpus import corpus_columns, read_rows
from distributed_emb.data.epoch_order import DataPosition, EpochOrder
from distributed_emb.data.epoch_stream import numpy_batch
from distributed_emb.data.readers import ROW_ID
from distributed_emb.data.sources import CorpusError
from distributed_emb.data.stream import local_epoch_tables, text_source
from distributed_emb.data.token_cache import cache_key, key_id
from distributed_emb.paths import shipped_corpus

ROWS = 40
NO_NEGATIVE = {3: None, 7: "   "}  # rows whose negative is null or blank: dropped, counted
MAX_LEN = 12


def _corpus(directory: Path) -> Path:
    """The mining job's layout: id, text, negative (each row's next sentence), negative_id."""
    texts = Path(shipped_corpus("wiki_sentences.txt")).read_text().splitlines()[:ROWS]
    texts[0] = "A short one."  # shorter than its negative, which MAX_LEN cuts
    negatives = [NO_NEGATIVE.get(i, texts[(i + 1) % ROWS]) for i in range(ROWS)]
    path = directory / "negatives.parquet"
    ids = list(range(ROWS))
    table = {"id": ids, "text": texts, "negative": negatives, "negative_id": ids[1:] + ids[:1]}
    pq.write_table(pa.table(table), path)
    return path


def _config(corpus: Path, model: str, tmp_path: Path, *overrides: str) -> TrainingConfig:
    return load_config(
        TrainingConfig,
        None,
        [
            f"model.path={model}",
            f"model.max_seq_length={MAX_LEN}",
            f"data.path={corpus}",
            "data.negative_column=negative",
            f"data.token_cache_dir={tmp_path / 'cache'}",
            f"output.dir={tmp_path / 'run'}",
            *overrides,
        ],
    )


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["data.negative_column=text"], "'text' is also data.text_column"),
        (
            ["data.kind=pairs", "data.negative_column=positive"],
            "'positive' is also data.positive_column",
        ),
        (
            ["loss.contrastive_weight=0", "loss.reconstruction_weight=1"],
            "loss.contrastive_weight is 0",
        ),
    ],
)
def test_a_negative_column_no_term_can_use_is_refused_naming_the_key(overrides, says):
    with pytest.raises(ConfigError, match=rf"data\.negative_column: .*{says}"):
        load_config(TrainingConfig, None, ["data.negative_column=negative", *overrides])


def test_a_row_without_its_negative_is_dropped_and_counted(tmp_path, tiny_bert_path):
    corpus = _corpus(tmp_path)
    config = _config(corpus, tiny_bert_path, tmp_path)
    assert corpus_columns(config.data) == ["text", "negative"]
    rows, report = read_rows(str(corpus), corpus_columns(config.data))
    assert len(rows["negative"]) == ROWS - 2 and report.dropped == {"empty": 2}
    assert report.examples["empty"] == [f"{corpus}:row 4: negative is null", f"{corpus}:row 8"]

    # A file with no negative column at all: an error naming the file and the column.
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"text": ["One.", "Two."]}), plain)
    with pytest.raises(CorpusError, match=rf"{plain}: no column 'negative'"):
        read_rows(str(plain), corpus_columns(config.data))
    # JSONL rows without the field: dropped and counted by name.
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text('{"text": "One.", "negative": "Two."}\n{"text": "Three."}\n')
    rows, report = read_rows(str(jsonl), corpus_columns(config.data))
    assert rows == {"text": ["One."], "negative": ["Two."]}
    assert report.dropped == {"missing_field:negative": 1}


def test_the_token_cache_key_changes_with_the_negative_column(tmp_path, tiny_bert_path):
    corpus = _corpus(tmp_path)

    def key(*overrides: str) -> str:
        config = _config(corpus, tiny_bert_path, tmp_path, *overrides)
        return key_id(cache_key(config.data, config.stream_settings()))

    with_negatives = key()
    assert with_negatives == key()
    assert key("data.negative_column=null") != with_negatives


def _texts_by_row_id(config) -> dict[int, tuple[str, str]]:
    """The clean rows in this process (no Ray): {row id: (text, negative)}."""
    source = text_source(config.data, counter=None)
    tables = local_epoch_tables(source, EpochOrder(None, 0), DataPosition())
    return {
        row[ROW_ID]: (row["text"], row["negative"]) for table in tables for row in table.to_pylist()
    }


def _assert_collates_as_text(tables, texts: dict, model_path: str) -> int:
    """Each rank's slice (token ids) collates to what the worker makes from the row's texts;
    returns the rows checked."""
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    collate = ContrastiveCollator(tokenizer, MAX_LEN, negative_column="negative")
    checked = 0
    for table in tables:
        assert "negative__ids" in table.column_names and "negative" not in table.column_names
        got = collate(numpy_batch(table))
        rows = [texts[row_id] for row_id in table.column(ROW_ID).to_pylist()]
        expected = collate(
            {
                "text": np.array([text for text, _ in rows], dtype=object),
                "negative": np.array([negative for _, negative in rows], dtype=object),
                ROW_ID: np.array(table.column(ROW_ID).to_pylist()),
            }
        )
        for key in ("input_ids", "attention_mask", *NEGATIVE_KEYS, "num_truncated"):
            assert torch.equal(got[key], expected[key]), key
        checked += table.num_rows
    return checked


@pytest.mark.ray
def test_negatives_reach_the_collator_from_the_cache_and_the_feeder(
    ray_local, tmp_path, tiny_bert_path
):
    from harness.feeder import served_batches

    from distributed_emb.data.corpus import collect_report, start_drop_counter
    from distributed_emb.data.global_batches import batch_plan
    from distributed_emb.data.indexed_shards import LENGTH, ShardReader
    from distributed_emb.data.rank_batches import IndexedSource, RankBatches
    from distributed_emb.data.token_cache import token_shards
    from distributed_emb.data.tokenize import tokenize_stage

    corpus = _corpus(tmp_path)
    config = _config(
        corpus, tiny_bert_path, tmp_path, "data.token_cache=on", "data.tokenize_in=ray_data"
    )
    texts = _texts_by_row_id(config)
    assert len(texts) == ROWS - 2
    plan = batch_plan(config.data, global_batch=8)

    # The token cache's indexed shards: the negatives tokenised beside the text, and a row's
    # length for grouping is its longest text.
    shards = token_shards(config.data, config.stream_settings())
    assert shards.rows == ROWS - 2 and shards.report.dropped == {"empty": 2}
    stored = ShardReader(shards.index).take(np.arange(shards.rows)).to_pylist()
    assert all(
        row[LENGTH] == max(len(row["text__ids"]), len(row["negative__ids"])) for row in stored
    )
    assert any(len(row["negative__ids"]) > len(row["text__ids"]) for row in stored)
    rank = RankBatches(IndexedSource(shards.index), plan, rank=1, world_size=2)
    slices = [table for table, _ in rank.epoch(DataPosition())]
    assert _assert_collates_as_text(slices, texts, tiny_bert_path) == 4 * ((ROWS - 2) // 8)

    # The streamed path: cleaned and tokenised by Ray Data, cut by the run's feeder.
    counter = start_drop_counter()
    stage = tokenize_stage(config.data, config.stream_settings())
    assert stage is not None
    source = text_source(config.data, counter, [stage])
    served = [batch for batch, _ in served_batches(source, plan, 2, DataPosition())]
    assert _assert_collates_as_text(served, texts, tiny_bert_path) == 8 * ((ROWS - 2) // 8)
    assert collect_report(counter).dropped == {"empty": 2}
