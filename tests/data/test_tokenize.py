"""Token ids made by the Ray Data stage equal the worker-side tokenizer's, batch for batch."""

import numpy as np
import pyarrow as pa
import pytest
import torch
from transformers import AutoTokenizer

from distributed_emb.data.collate import ContrastiveCollator, LengthGroupedCollator
from distributed_emb.data.tokenize import tokenize_columns

TEXTS = ["A short one.", "A much longer sentence that the max length will surely cut.", "Mid."]


def _as_batch(table: pa.Table) -> dict:
    return {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}


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


def test_pretokenised_pairs_and_length_grouping(tiny_bert_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_path)
    table = pa.table({"anchor": TEXTS * 2, "positive": TEXTS[::-1] * 2, "doc": ["a", "b", "c"] * 2})
    staged = tokenize_columns(table, tiny_bert_path, 12, ["anchor", "positive"])

    def collator():
        inner = ContrastiveCollator(tokenizer, 12, kind="pairs", group_column="doc")
        return LengthGroupedCollator(inner, batch_size=2, seed=0)

    worker, stage = collator()(_as_batch(table)), collator()(_as_batch(staged))
    assert len(worker) == len(stage) == 3
    for a, b in zip(worker, stage):
        for key in a:
            assert torch.equal(a[key], b[key]), key
    assert np.array_equal(
        collator().collator.token_lengths(_as_batch(table)),
        collator().collator.token_lengths(_as_batch(staged)),
    )
