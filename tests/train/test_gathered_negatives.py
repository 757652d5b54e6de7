"""2 gloo processes with gathered hard negatives == 1 process on the concatenated batch.

The harness of test_gathered_gradients.py (TrainableEncoder, tiny BERT, DDPEngine, dropout off,
float64), its pairs and documents, and a hard negative a row (data.negative_column): 11 rows,
so split_rows gives the ranks unequal slices (6 + 5). Every anchor's candidates are the 11
gathered positives and the 11 gathered negatives; the plain step and GradCache (mini-batches of
5: the short rank makes up its second mini-batch with a filler) must both give the one-process
loss and gradients.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_gathered_gradients import ANCHORS, GROUPS, POSITIVES, TRAIN, WEIGHTS

from distributed_emb.data.epoch_plan import split_rows

ROWS = 11
NEGATIVES = [
    "A woman sings a song.",
    "The dog barks at night.",
    "Bonds rose slowly.",
    "He writes a short poem.",
    "The sun shines all week.",
    "Three cats sit indoors.",
    "She baked fresh bread.",
    "The bus came early.",
    "Adults read the news.",
    "The library closes at five.",
    "A sailor ties a knot.",
]
TIGHT = {"rtol": 1e-9, "atol": 1e-12}
MINI_BATCH = 5


def _batch(model_path: str, rows: slice, negatives: bool = True):
    from transformers import AutoTokenizer

    from distributed_emb.data.collate import ContrastiveCollator

    collate = ContrastiveCollator(
        AutoTokenizer.from_pretrained(model_path),
        32,
        kind="pairs",
        group_column="doc",
        negative_column="negative" if negatives else None,
    )
    columns = {"anchor": ANCHORS, "positive": POSITIVES, "doc": GROUPS, "negative": NEGATIVES}
    return collate({name: np.array(values[rows]) for name, values in columns.items()})


def _engine(model_path: str):
    from distributed_emb.model.encoder import TrainableEncoder
    from distributed_emb.train.engine import DDPEngine

    torch.manual_seed(0)  # same MLP-head init on every process
    encoder = TrainableEncoder(model_path, pooler="mean", mlp_head=True).double().eval()
    return encoder, DDPEngine(encoder, TRAIN, total_steps=1, device=torch.device("cpu"))


def _gradients(encoder) -> dict[str, torch.Tensor]:
    grads = {n: p.grad.clone() for n, p in encoder.named_parameters() if p.grad is not None}
    encoder.zero_grad(set_to_none=True)
    return grads


def _plain(model_path: str, rows: slice, negatives: bool = True):
    """(the loss backpropagated, the reported loss, gradients after DDP's average)."""
    from distributed_emb.train.step import forward_objective

    encoder, engine = _engine(model_path)
    batch = _batch(model_path, rows, negatives)
    loss, metrics = forward_objective(engine.forward_module, batch, WEIGHTS)
    engine.backward(loss)
    return loss.detach(), metrics["loss"], _gradients(encoder)


def _worker(rank: int, world: int, init_file: str, model_path: str, out_dir: str) -> None:
    from distributed_emb.train.grad_cache import cached_step

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    start, stop = split_rows(ROWS, world, rank)
    rows = slice(start, stop)
    loss, reported, grads = _plain(model_path, rows)
    encoder, engine = _engine(model_path)
    cached = cached_step(engine, _batch(model_path, rows), WEIGHTS, MINI_BATCH, sync=True)
    results = {
        "loss": loss,
        "reported": reported,
        "rows": stop - start,
        "grads": grads,
        "cached_loss": cached["loss"],
        "cached_grads": _gradients(encoder),
    }
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def _assert_same_gradients(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.allclose(got[name], value, **TIGHT), (
            name,
            float((got[name] - value).abs().max()),
            float(value.abs().max()),
        )


@pytest.mark.slow
def test_two_workers_with_negatives_equal_one_process(tiny_bert_path, tmp_path):
    world = 2
    mp.spawn(
        _worker,
        args=(world, str(tmp_path / "init"), tiny_bert_path, str(tmp_path)),
        nprocs=world,
        join=True,
    )
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    assert [r["rows"] for r in ranks] == [6, 5]
    reference_loss, _, reference_grads = _plain(tiny_bert_path, slice(0, ROWS))

    # Every rank reports the global loss; the weighted losses they backpropagate average to it.
    for results in ranks:
        assert torch.allclose(results["reported"], reference_loss, **TIGHT)
        assert torch.allclose(results["cached_loss"], reference_loss, **TIGHT)
        _assert_same_gradients(results["grads"], reference_grads)
        _assert_same_gradients(results["cached_grads"], reference_grads)
    assert torch.allclose(sum(r["loss"] for r in ranks) / world, reference_loss, **TIGHT)

    # The check has teeth: the negatives change the one-process loss and gradients.
    without_loss, _, without_grads = _plain(tiny_bert_path, slice(0, ROWS), negatives=False)
    assert float(without_loss) < float(reference_loss)
    name = "backbone.embeddings.word_embeddings.weight"
    assert not torch.allclose(without_grads[name], reference_grads[name])
