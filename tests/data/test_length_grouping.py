"""Length-grouped batches: the same rows, batches of similar length, less padding."""

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from distributed_emb.data.collate import ContrastiveCollator, LengthGroupedCollator
from distributed_emb.paths import shipped_corpus


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    return AutoTokenizer.from_pretrained(minilm_path)


@pytest.fixture(scope="module")
def sentences() -> np.ndarray:
    lines = open(shipped_corpus("wiki_sentences.txt")).read().splitlines()[:70]
    return np.array(lines, dtype=object)


def decoded_rows(tokenizer, batch, rows=None) -> list[str]:
    ids = batch["input_ids"] if rows is None else batch["input_ids"][rows]
    return tokenizer.batch_decode(ids, skip_special_tokens=True)


def test_pool_cut_into_full_batches_of_similar_length(tokenizer, sentences):
    collate = ContrastiveCollator(tokenizer, max_seq_length=64)
    batches = LengthGroupedCollator(collate, batch_size=8, seed=1)({"text": sentences})

    assert len(batches) == 70 // 8  # the 6-row remainder is dropped
    assert all(b["input_ids"].shape[0] == 16 for b in batches)  # two views of 8 rows
    # Every batch is what the plain collator makes of its rows: two identical views.
    assert all(torch.equal(b["input_ids"][:8], b["input_ids"][8:]) for b in batches)
    lengths = collate.token_lengths({"text": sentences})
    kept = sorted(lengths)[:64]  # sorted pool, remainder cut from the long end
    got = sorted(int(n) for b in batches for n in b["attention_mask"][:8].sum(1))
    assert got == kept
    # Each batch spans a narrow band of lengths, so padding falls well below random batches'.
    random_padded = sum(int(lengths[i : i + 8].max()) * 8 for i in range(0, 64, 8))
    grouped_padded = sum(b["attention_mask"][:8].numel() for b in batches)
    assert grouped_padded < 0.8 * random_padded
    assert sum(int(b["num_real_tokens"]) for b in batches) == 2 * sum(kept)


def test_batch_order_is_shuffled_and_seeded(tokenizer, sentences):
    collate = ContrastiveCollator(tokenizer, max_seq_length=64)

    def widths(seed):
        batches = LengthGroupedCollator(collate, 8, seed=seed)({"text": sentences})
        return [b["input_ids"].shape[1] for b in batches]

    assert widths(3) == widths(3)
    assert widths(3) != sorted(widths(3)) or widths(4) != sorted(widths(4))


def test_pairs_stay_together(tokenizer):
    collate = ContrastiveCollator(tokenizer, 32, kind="pairs", group_column="doc")
    anchors = np.array([("word " * n).strip() for n in (9, 1, 5, 3)], dtype=object)
    positives = np.array([f"positive {n}" for n in (9, 1, 5, 3)], dtype=object)
    docs = np.array(["a", "b", "c", "d"], dtype=object)
    batches = LengthGroupedCollator(collate, 2, seed=0)(
        {"anchor": anchors, "positive": positives, "doc": docs}
    )
    pairs = set()
    for batch in batches:
        rows = decoded_rows(tokenizer, batch)
        pairs |= {(rows[i], rows[i + 2]) for i in range(2)}
    assert pairs == {(a, p) for a, p in zip(anchors, positives)}
    # The two shortest anchors (1 and 3 words) share a batch.
    anchor_sets = [set(decoded_rows(tokenizer, b)[:2]) for b in batches]
    assert {"word", "word word word"} in anchor_sets
