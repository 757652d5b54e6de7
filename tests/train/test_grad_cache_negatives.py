"""GradCache (cached_step) with hard negatives computes the plain step's loss and gradients.

The harness of test_grad_cache.py (tiny BERT, float64, dropout 0.1): the reference is the plain
step's math (forward_objective, which embeds views and negatives as one (3B, L) forward) with
its forward run over the cached step's mini-batches from the same RNG state; with dropout off,
plain_step itself.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_grad_cache import (
    NO_MLM,
    POSITIVES,
    SENTENCES,
    TIGHT,
    WITH_MLM,
    _tokenizer,
    assert_same_gradients,
    assert_same_metrics,
    make_engine,
    run_both,
)

from distributed_emb.data.collate import NEGATIVE_KEYS
from distributed_emb.train.grad_cache import cached_step, forward_mini_batch, split_mini_batches

# Each sentence's hard negative: another sentence of the batch's topic list, lengths mixed so
# that mini-batches cut padding differently from the views.
NEGATIVES = [
    "A woman sings.",
    "The dog barks at the postman every single morning of the week.",
    "Bonds rose.",
    "He is writing a short letter.",
    "Sun all week long, say the forecasts for the whole region.",
    "Cats sleep inside.",
    "She baked bread.",
    "The bus was early.",
]


def negatives_batch(model_path: str, kind: str, rows: slice = slice(None), mlm: bool = True):
    from distributed_emb.data.collate import ContrastiveCollator

    collate = ContrastiveCollator(
        _tokenizer(model_path),
        32,
        kind=kind,
        negative_column="negative",
        mlm_probability=0.3 if mlm else None,
        seed=0,
    )
    columns = {"negative": NEGATIVES[rows]}
    if kind == "sentences":
        columns["text"] = SENTENCES[rows]
    else:
        columns.update(anchor=SENTENCES[rows], positive=POSITIVES[rows])
    return collate({k: np.array(v) for k, v in columns.items()})


class NegativesMiniBatchForward:
    """The encoder over the cached step's mini-batches (views and negatives together), one
    call each, graph kept, reassembled in forward_objective's (3B, d) order."""

    def __init__(self, forward_module, mini_batch_size: int):
        self.forward_module = forward_module
        self.mini_batch_size = mini_batch_size

    def __call__(self, input_ids, attention_mask, mlm_input_ids=None, mlm_attention_mask=None):
        use_mlm = mlm_input_ids is not None
        views = 2 * input_ids.shape[0] // 3
        batch = {
            "input_ids": input_ids[:views],
            "attention_mask": attention_mask[:views],
            NEGATIVE_KEYS[0]: input_ids[views:],
            NEGATIVE_KEYS[1]: attention_mask[views:],
        }
        if use_mlm:  # labels only steer the split's padding cut; the loss gets the real ones
            batch.update(
                mlm_input_ids=mlm_input_ids,
                mlm_attention_mask=mlm_attention_mask,
                mlm_labels=torch.zeros_like(mlm_input_ids),
            )
        blocks, all_logits = [[], [], []], []
        for mini in split_mini_batches(batch, self.mini_batch_size, use_mlm):
            z, logits = forward_mini_batch(self.forward_module, mini, use_mlm)
            for pieces, part in zip(blocks, z.chunk(3), strict=True):
                pieces.append(part)
            if use_mlm:  # (m, L_j, V) → (m, L, V); the cut columns are unmasked (label −100)
                pad = mlm_input_ids.shape[1] - logits.shape[1]
                all_logits.append(torch.nn.functional.pad(logits, (0, 0, 0, pad)))
        z = torch.cat([piece for pieces in blocks for piece in pieces])  # (3B, d)
        return (z, torch.cat(all_logits)) if use_mlm else z


class NegativesMiniBatchEngine:
    def __init__(self, engine, mini_batch_size: int):
        self.engine = engine
        self.forward_module = NegativesMiniBatchForward(engine.forward_module, mini_batch_size)

    def __getattr__(self, name):
        return getattr(self.engine, name)


@pytest.mark.parametrize("kind, mini_batch_size", [("sentences", 8), ("pairs", 3)])
def test_without_dropout_equals_plain_step(tiny_bert_path, kind, mini_batch_size):
    engine = make_engine(tiny_bert_path, WITH_MLM, train=False)
    batch = negatives_batch(tiny_bert_path, kind)
    reference, expected, cached, got, _ = run_both(engine, engine, batch, WITH_MLM, mini_batch_size)
    assert_same_metrics(cached, reference)
    assert_same_gradients(got, expected, **TIGHT)
    # The negatives count: without them the same rows give another loss.
    plain = {k: v for k, v in batch.items() if k not in NEGATIVE_KEYS}
    without = cached_step(engine, plain, WITH_MLM, mini_batch_size, sync=True)
    engine.module.zero_grad(set_to_none=True)
    assert float(without["loss_contrastive"]) < float(cached["loss_contrastive"])
    assert torch.allclose(without["loss_reconstruction"], cached["loss_reconstruction"], **TIGHT)


@pytest.mark.parametrize(
    "weights, mini_batch_size", [(WITH_MLM, 3), (NO_MLM, 1)], ids=["mlm_m3", "no_mlm_m1"]
)
def test_with_dropout_equals_plain_step_on_same_masks(tiny_bert_path, mini_batch_size, weights):
    engine = make_engine(tiny_bert_path, weights, train=True)
    batch = negatives_batch(tiny_bert_path, "sentences", mlm=weights.mlm_weight > 0)
    reference, expected, cached, got, (rng_a, rng_b) = run_both(
        engine, NegativesMiniBatchEngine(engine, mini_batch_size), batch, weights, mini_batch_size
    )
    assert_same_metrics(cached, reference)
    assert_same_gradients(got, expected, **TIGHT)
    assert torch.equal(rng_a, rng_b)


def test_split_keeps_views_and_negative_together(tiny_bert_path):
    batch = negatives_batch(tiny_bert_path, "pairs")
    minis = split_mini_batches(batch, 3, use_mlm=True)
    assert [m["input_ids"].shape[0] for m in minis] == [9, 9, 6]
    b, second = len(SENTENCES), minis[1]
    length = second["input_ids"].shape[1]
    assert torch.equal(second["input_ids"][:3], batch["input_ids"][3:6, :length])  # anchors
    assert torch.equal(second["input_ids"][3:6], batch["input_ids"][b + 3 : b + 6, :length])
    assert torch.equal(second["input_ids"][6:], batch[NEGATIVE_KEYS[0]][3:6, :length])
    assert bool(second["attention_mask"][:, -1].any())  # no all-padding column left
    short = dict(batch)
    short[NEGATIVE_KEYS[0]] = batch[NEGATIVE_KEYS[0]][:-1]
    with pytest.raises(ValueError, match="expected B = 8"):
        split_mini_batches(short, 2, use_mlm=False)
