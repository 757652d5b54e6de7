"""Token ids made by the Ray Data stage (the shards' build) equal the tokenizer's on the text,
batch for batch."""

import pyarrow as pa
import pytest
import torch
from transformers import AutoTokenizer

from distributed_emb.data.batches import NO_TOKEN, numpy_batch
from distributed_emb.data.collate import ContrastiveCollator
from distributed_emb.data.tokenize import TextEncoder, tokenize_columns

TEXTS = ["A short one.", "A much longer sentence that the max length will surely cut.", "Mid."]


def _as_batch(table: pa.Table) -> dict:
    return numpy_batch(table)  # what a rank hands the collator


@pytest.mark.parametrize("mlm", [None, 0.15])
def test_pretokenised_sentences_collate_to_the_same_tensors(tiny_bert_path, mlm):
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_path)
    table = pa.table({"text": TEXTS, "_row_id": [1, 2, 3]})
    staged = tokenize_columns(table, tiny_bert_path, 8, ["text"])
    assert "text" not in staged.column_names
    worker = ContrastiveCollator(tokenizer, 8, mlm_probability=mlm, seed=3)(_as_batch(table))
    stage = ContrastiveCollator(tokenizer, 8, mlm_probability=mlm, seed=3)(_as_batch(staged))
    assert worker.keys() == stage.keys()
    for key in worker:
        assert torch.equal(worker[key], stage[key]), key
    assert int(stage["num_truncated"]) == 1


def test_pretokenised_pairs_collate_the_same_and_group_by_token_count(tiny_bert_path):
    from distributed_emb.data.epoch_plan import length_of_rows

    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_path)
    table = pa.table({"anchor": TEXTS * 2, "positive": TEXTS[::-1] * 2, "doc": ["a", "b", "c"] * 2})
    staged = tokenize_columns(table, tiny_bert_path, 12, ["anchor", "positive"])

    def collate(batch):
        return ContrastiveCollator(tokenizer, 12, kind="pairs", group_column="doc")(batch)

    worker, stage = collate(_as_batch(table)), collate(_as_batch(staged))
    for key in worker:
        assert torch.equal(worker[key], stage[key]), key
    # Length grouping of tokenised rows counts tokens: the longer side of each pair.
    tokens = [
        max(len(tokenizer(a, truncation=True, max_length=12)["input_ids"]),
            len(tokenizer(p, truncation=True, max_length=12)["input_ids"]))
        for a, p in zip(TEXTS * 2, TEXTS[::-1] * 2)
    ]  # fmt: skip
    assert list(length_of_rows(staged, ("anchor", "positive"))) == tokens


def test_the_fast_path_equals_the_tokenizer_call(tiny_bert_path):
    texts = TEXTS * 30 + ["Ünïcödé — “quotes”, ß and 日本語.", "x" * 300, "tabs\tand  spaces"]
    fast = TextEncoder(AutoTokenizer.from_pretrained(tiny_bert_path), 8)
    ids, truncated = fast(texts)
    assert fast.backend is not None  # the self-check passed: still the fast path
    expected_ids, expected_truncated = fast.reference(texts)
    assert ids.equals(expected_ids) and truncated.equals(expected_truncated)
    assert 0 < sum(truncated.to_pylist()) < len(texts)


def test_a_backend_that_disagrees_falls_back_to_the_tokenizer(tiny_bert_path, caplog):
    encoder = TextEncoder(AutoTokenizer.from_pretrained(tiny_bert_path), 8)
    encoder.backend.enable_truncation(4)  # stands in for a tokenizer with Python-side work
    ids, _ = encoder(TEXTS)
    assert encoder.backend is None and "other ids than the tokenizer" in caplog.text
    assert ids.equals(encoder.reference(TEXTS)[0])
    assert max(len(row) for row in ids.to_pylist()) == 8


def test_token_id_lists_become_one_matrix_from_any_slice_of_any_chunks():
    lists = [[101, 7, 102], [101, 102], [101, 5, 6, 9, 102], [101, 3, 102]]
    chunked = pa.chunked_array(
        [pa.array(lists[:2], pa.list_(pa.int32())), pa.array(lists[2:], pa.list_(pa.int32()))]
    )
    table = pa.table({"text__ids": chunked, "_row_id": [1, 2, 3, 4]}).slice(1, 3)
    batch = numpy_batch(table)
    assert batch["text__ids"].tolist() == [
        [101, 102, NO_TOKEN, NO_TOKEN, NO_TOKEN],
        [101, 5, 6, 9, 102],
        [101, 3, 102, NO_TOKEN, NO_TOKEN],
    ]
    assert batch["_row_id"].tolist() == [2, 3, 4]
