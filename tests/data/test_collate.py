import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from distributed_emb.data.collate import ContrastiveCollator


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    return AutoTokenizer.from_pretrained(minilm_path)


def test_two_views_stacked_and_truncation_counted(tokenizer):
    collate = ContrastiveCollator(tokenizer, max_seq_length=8)
    texts = np.array(["short one", "this sentence is certainly longer than eight word pieces"])
    batch = collate({"text": texts})
    assert batch["input_ids"].shape[0] == 4
    assert torch.equal(batch["input_ids"][:2], batch["input_ids"][2:])
    assert batch["input_ids"].shape[1] == 8  # dynamic padding up to the cap
    assert int(batch["num_truncated"]) == 1


def test_dynamic_padding_to_longest_row(tokenizer):
    batch = ContrastiveCollator(tokenizer, max_seq_length=64)({"text": np.array(["a b", "a"])})
    assert batch["input_ids"].shape[1] == 4  # [CLS] a b [SEP]


def test_pairs_anchor_rows_then_positive_rows(tokenizer):
    collate = ContrastiveCollator(tokenizer, 16, kind="pairs", group_column="doc")
    batch = collate(
        {
            "anchor": np.array(["x one", "y two"]),
            "positive": np.array(["p", "q"]),
            "doc": np.array(["d1", "d1"]),
        }
    )
    decoded = tokenizer.batch_decode(batch["input_ids"], skip_special_tokens=True)
    assert decoded == ["x one", "y two", "p", "q"]
    assert batch["groups"][0] == batch["groups"][1]


def test_mlm_masking_rates_and_labels(tokenizer):
    collate = ContrastiveCollator(tokenizer, 64, mlm_probability=0.15, seed=3)
    texts = np.array(["the quick brown fox jumps over the lazy dog again and again"] * 64)
    batch = collate({"text": texts})
    labels, masked = batch["mlm_labels"], batch["mlm_input_ids"]
    original = batch["input_ids"][:64]
    chosen = labels != -100
    special = (original == tokenizer.cls_token_id) | (original == tokenizer.sep_token_id)
    assert not (chosen & special).any()  # never mask [CLS]/[SEP]
    assert torch.equal(labels[chosen], original[chosen])
    rate = chosen.sum().item() / (~special & batch["attention_mask"][:64].bool()).sum().item()
    assert 0.10 < rate < 0.20
    mask_share = (masked[chosen] == tokenizer.mask_token_id).float().mean().item()
    assert 0.7 < mask_share < 0.9
    assert torch.equal(masked[~chosen], original[~chosen])
