"""The collator with a negative column (data.negative_column): each row's hard negative as a
(B, L) block of its own, padded with the views, from text or from Ray Data's token ids."""

import numpy as np
import pyarrow as pa
import pytest
import torch
from transformers import AutoTokenizer

from distributed_emb.data.batches import numpy_batch
from distributed_emb.data.collate import NEGATIVE_KEYS, ContrastiveCollator
from distributed_emb.data.tokenize import tokenize_columns

TEXTS = ["a cat sat", "the river floods every spring", "he plays"]
NEGATIVES = ["a dog sat on the mat all day long", "rain", "she sings loudly"]


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    return AutoTokenizer.from_pretrained(minilm_path)


def _decoded(tokenizer, ids: torch.Tensor) -> list[str]:
    return tokenizer.batch_decode(ids, skip_special_tokens=True)


def test_sentences_two_views_then_negatives_padded_to_one_length(tokenizer):
    collate = ContrastiveCollator(tokenizer, 8, negative_column="negative")
    batch = collate({"text": np.array(TEXTS), "negative": np.array(NEGATIVES)})
    ids, negative_ids = batch["input_ids"], batch[NEGATIVE_KEYS[0]]
    assert ids.shape == (6, 8) and negative_ids.shape == (3, 8)  # the longest: a cut negative
    assert torch.equal(ids[:3], ids[3:])
    assert _decoded(tokenizer, ids[:3]) == TEXTS
    assert _decoded(tokenizer, negative_ids) == ["a dog sat on the mat", "rain", "she sings loudly"]
    assert int(batch["num_truncated"]) == 1  # the first negative
    mask = batch[NEGATIVE_KEYS[1]]
    assert int(batch["num_real_tokens"]) == int(batch["attention_mask"].sum() + mask.sum())
    assert torch.equal(mask.bool(), negative_ids != tokenizer.pad_token_id)


def test_pairs_anchors_positives_then_negatives(tokenizer):
    collate = ContrastiveCollator(
        tokenizer, 16, kind="pairs", group_column="doc", negative_column="hard"
    )
    batch = collate(
        {
            "anchor": np.array(TEXTS),
            "positive": np.array(["p", "q", "r"]),
            "hard": np.array(NEGATIVES),
            "doc": np.array(["d1", "d1", "d2"]),
        }
    )
    assert _decoded(tokenizer, batch["input_ids"]) == [*TEXTS, "p", "q", "r"]
    assert _decoded(tokenizer, batch[NEGATIVE_KEYS[0]]) == NEGATIVES
    assert batch["groups"].shape == (3,)


def test_without_a_negative_column_there_is_no_negative_block(tokenizer):
    batch = ContrastiveCollator(tokenizer, 16)({"text": np.array(TEXTS)})
    assert not set(NEGATIVE_KEYS) & set(batch)
    assert int(batch["num_real_tokens"]) == int(batch["attention_mask"].sum())


@pytest.mark.parametrize("kind", ["sentences", "pairs"])
def test_token_ids_from_ray_data_give_the_worker_side_batch(tokenizer, minilm_path, kind):
    """The shards' build (tokenize_columns) makes `negative__ids` as for every corpus column;
    padded in the worker they are exactly the tokenisation of the text, MLM too."""
    columns = ["text", "negative"] if kind == "sentences" else ["anchor", "positive", "negative"]
    table = pa.table(dict.fromkeys(columns[:-1], TEXTS) | {"negative": NEGATIVES})
    texts = {name: table.column(name).to_numpy(zero_copy_only=False) for name in columns}
    tokenised = numpy_batch(tokenize_columns(table, minilm_path, 8, columns))
    assert "negative__ids" in tokenised and "negative" not in tokenised

    def collate():
        return ContrastiveCollator(
            tokenizer, 8, kind=kind, negative_column="negative", mlm_probability=0.3, seed=1
        )

    expected, got = collate()(texts), collate()(tokenised)
    assert expected.keys() == got.keys() and set(NEGATIVE_KEYS) <= set(got)
    for key in expected:
        assert torch.equal(got[key], expected[key]), key
