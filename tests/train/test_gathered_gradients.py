"""W gloo processes with gathered negatives == 1 process on the concatenated batch.

The real path: TrainableEncoder (tiny BERT) under DDPEngine, forward_objective with InfoNCE over
the gathered batch, λ·reconstruction and same-document masking. Dropout is off (eval mode) so
both computations see the same function; float64 so the comparison is tight. The global batch
of 12 rows goes to 2 workers (6 each), and one of 11 rows to 3 (4, 4, 3: split_rows' unequal
slices, which the gathers pad and trim and the step weights by W·B_r/G). Three processes show
the unequal case as five did (3, 3, 2, 2, 2 of 12 rows), for two fewer processes that each
import torch and build the model.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from distributed_emb.data.epoch_plan import split_rows
from distributed_emb.losses.loss_config import LossConfig
from distributed_emb.train.train_config import TrainLoopConfig

ANCHORS = [
    "A man is playing a guitar.",
    "The cat sleeps on the sofa.",
    "Stocks fell sharply today.",
    "She is reading a long novel.",
    "Rain is expected tomorrow.",
    "Two dogs run in a park.",
    "He cooked pasta for dinner.",
    "The train was late again.",
    "Children build a sandcastle.",
    "The museum opens at nine.",
    "A pilot lands the plane.",
    "Snow covered the mountain road.",
]
POSITIVES = [
    "Someone plays an instrument.",
    "A kitten naps on a couch.",
    "Markets dropped a lot.",
    "A woman reads a book.",
    "It will rain on the next day.",
    "Dogs are running outside.",
    "Dinner was pasta he made.",
    "Again the train came late.",
    "Kids make a castle of sand.",
    "Doors of the museum open at 9.",
    "The aircraft touches down.",
    "The mountain road was snowy.",
]
GROUPS = ["d1", "d1", "d2", "d3", "d4", "d4", "d5", "d6", "d7", "d7", "d8", "d9"]
WEIGHTS = LossConfig(
    temperature=0.05, reconstruction_weight=0.5, reconstruction_form="squared_norm"
)


# The engine's knobs for this check: no clipping (the real TrainLoopConfig).
TRAIN = TrainLoopConfig(max_grad_norm=None, learning_rate=1e-3)


def _batch(model_path: str, rows: slice):
    from transformers import AutoTokenizer

    from distributed_emb.data.collate import ContrastiveCollator

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    collate = ContrastiveCollator(tokenizer, 32, kind="pairs", group_column="doc")
    return collate(
        {
            "anchor": np.array(ANCHORS[rows]),
            "positive": np.array(POSITIVES[rows]),
            "doc": np.array(GROUPS[rows]),
        }
    )


def _loss_and_grads(model_path: str, rows: slice):
    """(the loss backpropagated, the reported loss, gradients after DDP's average)."""
    from distributed_emb.model.encoder import TrainableEncoder
    from distributed_emb.train.engine import DDPEngine
    from distributed_emb.train.step import forward_objective

    torch.manual_seed(0)  # same MLP-head init on every process
    encoder = TrainableEncoder(model_path, pooler="mean", mlp_head=True).double().eval()
    engine = DDPEngine(encoder, TRAIN, total_steps=1, device=torch.device("cpu"))
    loss, metrics = forward_objective(engine.forward_module, _batch(model_path, rows), WEIGHTS)
    engine.backward(loss)
    grads = {n: p.grad.clone() for n, p in encoder.named_parameters() if p.grad is not None}
    return loss.detach(), metrics["loss"], grads


def _worker(
    rank: int, world: int, rows: int, init_file: str, model_path: str, out_dir: str
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    start, stop = split_rows(rows, world, rank)
    loss, reported, grads = _loss_and_grads(model_path, slice(start, stop))
    torch.save(
        {"loss": loss, "reported": reported, "rows": stop - start, "grads": grads},
        os.path.join(out_dir, f"rank{rank}.pt"),
    )
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize(("world", "rows"), [(2, 12), (3, 11)])  # 6, 6; then 4, 4, 3
def test_workers_equal_single_process_on_concatenated_batch(tiny_bert_path, tmp_path, world, rows):
    mp.spawn(
        _worker,
        args=(world, rows, str(tmp_path / "init"), tiny_bert_path, str(tmp_path)),
        nprocs=world,
        join=True,
    )
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    reference_loss, _, reference_grads = _loss_and_grads(tiny_bert_path, slice(0, rows))
    sizes = [results["rows"] for results in ranks]
    assert sum(sizes) == rows and len(set(sizes)) == (1 if world == 2 else 2)

    # Every rank reports the global loss; the losses they backpropagate (each rank's local
    # mean weighted by W·B_r/G) average to it too.
    for results in ranks:
        assert torch.allclose(results["reported"], reference_loss, rtol=1e-9, atol=1e-12)
    distributed_loss = sum(results["loss"] for results in ranks) / world
    assert torch.allclose(distributed_loss, reference_loss, rtol=1e-9, atol=1e-12)
    # DDP leaves the same averaged gradient on every rank; it must equal the reference.
    assert reference_grads.keys() == ranks[0]["grads"].keys()
    for name, expected in reference_grads.items():
        for r in range(world):
            got = ranks[r]["grads"][name]
            assert torch.allclose(got, expected, rtol=1e-9, atol=1e-12), (
                name,
                (got - expected).abs().max(),
                expected.abs().max(),
            )
    # The check has teeth: the local-only loss (no gather) gives different gradients.
    assert not torch.allclose(ranks[0]["loss"], ranks[1]["loss"])
    if len(set(sizes)) > 1:
        # ...and with unequal slices the plain mean of the ranks' local means is not the
        # global mean: the weights are needed.
        local_means = [r["loss"] * rows / (world * r["rows"]) for r in ranks]
        assert not torch.allclose(sum(local_means) / world, reference_loss, rtol=1e-6)
