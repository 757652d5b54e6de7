"""A corpus with a hard-negative column (data.negative_column, as jobs/mine_negatives.py writes
it): declared once (data/corpus.py row_columns), read and cleaned like the row's text (a
missing or empty negative is dropped and counted), keyed into the token cache, and reaching
the collator as token ids from the indexed shards every rank reads."""

import ast
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoTokenizer

from distributed_emb.checks import ConfigError
from distributed_emb.config import TrainingConfig, load_config
from distributed_emb.data.batches import numpy_batch
from distributed_emb.data.collate import NEGATIVE_KEYS, ContrastiveCollator
from distributed_emb.data.corpus import corpus_columns, corpus_path, read_rows, text_rules
from distributed_emb.data.epoch_plan import DataPosition, batch_plan
from distributed_emb.data.readers import DROP, ROW_ID, iter_parsed_blocks
from distributed_emb.data.sources import CorpusError, resolve_sources
from distributed_emb.data.token_cache import cache_key, key_id
from distributed_emb.data.tokenize import tokenize_arguments
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


def test_a_row_column_is_declared_in_one_place(tmp_path, tiny_bert_path):
    """Everything in the data path that handles a row's texts takes them from
    data/corpus.py `row_columns`: adding a column (as the mined `negative` was) is one change
    there, beside its setting in data/data_config.py."""
    config = _config(_corpus(tmp_path), tiny_bert_path, tmp_path)
    declared = corpus_columns(config.data)
    assert declared == ["text", "negative"]
    settings = config.stream_settings()
    collator = ContrastiveCollator(
        AutoTokenizer.from_pretrained(tiny_bert_path), MAX_LEN, negative_column="negative"
    )
    users = {
        "the reading and cleaning rules": text_rules(config.data).columns,
        "the token cache's key": cache_key(config.data, settings)["cleaning"]["columns"],
        "the tokenising stage": tokenize_arguments(config.data, settings)["fn_kwargs"]["columns"],
        "the length for grouping": list(batch_plan(config.data, 8).length_columns),
        "the collator": collator.columns,
    }
    assert all(columns == declared for columns in users.values()), users
    # And no other module of data/ reads the setting itself.
    package = Path(__file__).resolve().parents[2] / "distributed_emb" / "data"
    readers = sorted(
        path.name
        for path in package.glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr == "negative_column"
    )
    assert set(readers) <= {"data_config.py", "corpus.py", "collate.py"}, readers


def _texts_by_row_id(config) -> dict[int, tuple[str, str]]:
    """The clean rows in this process (no Ray): {row id: (text, negative)}."""
    files = resolve_sources(corpus_path(config.data))
    return {
        row[ROW_ID]: (row["text"], row["negative"])
        for block in iter_parsed_blocks(files, text_rules(config.data))
        for row in block.to_pylist()
        if row[DROP] == ""
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
def test_negatives_reach_the_collator_from_the_shards(ray_local, tmp_path, tiny_bert_path):
    from distributed_emb.data.indexed_shards import LENGTH, ShardReader
    from distributed_emb.data.rank_batches import IndexedSource, RankBatches
    from distributed_emb.data.token_cache import token_shards

    corpus = _corpus(tmp_path)
    config = _config(corpus, tiny_bert_path, tmp_path)
    texts = _texts_by_row_id(config)
    assert len(texts) == ROWS - 2
    plan = batch_plan(config.data, global_batch=8)

    # The indexed shards: the negatives cleaned (dropped and counted) and tokenised beside the
    # text, and a row's length for grouping is its longest text.
    shards = token_shards(config.data, config.stream_settings())
    assert shards.rows == ROWS - 2 and shards.report.dropped == {"empty": 2}
    stored = ShardReader(shards.index).take(np.arange(shards.rows)).to_pylist()
    assert all(
        row[LENGTH] == max(len(row["text__ids"]), len(row["negative__ids"])) for row in stored
    )
    assert any(len(row["negative__ids"]) > len(row["text__ids"]) for row in stored)
    # Both ranks of 2: each slice collates to what the text makes, negatives included.
    for rank in (0, 1):
        reader = RankBatches(IndexedSource(shards.index), plan, rank=rank, world_size=2)
        slices = [table for table, _ in reader.epoch(DataPosition())]
        assert _assert_collates_as_text(slices, texts, tiny_bert_path) == 4 * ((ROWS - 2) // 8)
