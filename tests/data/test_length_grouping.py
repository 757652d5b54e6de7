"""Length grouping (data/epoch_plan.py): the same rows, batches of similar length, less
padding, in a seeded order."""

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from distributed_emb.data.collate import ContrastiveCollator
from distributed_emb.data.epoch_plan import EpochOrder, length_groups
from distributed_emb.paths import shipped_corpus


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    return AutoTokenizer.from_pretrained(minilm_path)


@pytest.fixture(scope="module")
def sentences() -> np.ndarray:
    lines = open(shipped_corpus("wiki_sentences.txt")).read().splitlines()[:70]
    return np.array(lines, dtype=object)


def test_pool_cut_into_full_batches_of_similar_length(tokenizer, sentences):
    collate = ContrastiveCollator(tokenizer, max_seq_length=64)
    characters = np.array([len(s) for s in sentences])
    groups = length_groups(characters, 8, np.random.default_rng(1).permutation(70 // 8))
    assert groups.shape == (8, 8)  # the 6-row remainder is dropped: the longest rows
    assert sorted(groups.reshape(-1)) == sorted(np.argsort(characters, kind="stable")[:64])
    batches = [collate({"text": sentences[rows]}) for rows in groups]
    # Each batch spans a narrow band of lengths, so padding falls well below random batches'.
    random_batches = [collate({"text": sentences[i : i + 8]}) for i in range(0, 64, 8)]
    random_padded = sum(b["attention_mask"][:8].numel() for b in random_batches)
    grouped_padded = sum(b["attention_mask"][:8].numel() for b in batches)
    assert grouped_padded < 0.8 * random_padded
    # Every batch is what the plain collator makes of its rows: two identical views.
    assert all(torch.equal(b["input_ids"][:8], b["input_ids"][8:]) for b in batches)


def test_the_batch_order_is_drawn_from_the_seed_and_the_pool():
    order = EpochOrder(seed=3, epoch=1)
    assert list(order.pool_batches(120, 8)) == list(EpochOrder(3, 1).pool_batches(120, 8))
    assert sorted(order.pool_batches(120, 8)) == list(range(8))
    draws = {tuple(order.pool_batches(start, 8)) for start in (0, 120, 240, 360)}
    assert len(draws) > 1  # pools are visited in their own orders
    assert list(EpochOrder(None, 1).pool_batches(120, 8)) == list(range(8))  # unshuffled


def test_ties_keep_stream_order():
    groups = length_groups(np.array([5, 1, 5, 1, 5, 1]), 3, np.arange(2))
    assert groups.tolist() == [[1, 3, 5], [0, 2, 4]]
