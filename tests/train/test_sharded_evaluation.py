"""In-training evaluation shared by the ranks (distributed.map_sharded) == one process.

Two gloo processes each embed every second dev sentence with the module being trained and
all-gather the parts; every rank must end with exactly the single-process embeddings of all
sentences, in input order, after making the same number of model calls (ZeRO-3 needs every rank
in every forward)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SENTENCES = [
    "A man is playing a guitar.",
    "The cat sleeps.",
    "Stocks fell sharply today after the central bank raised its rates again.",
    "She is reading a long novel about the sea.",
    "Rain.",
    "Two dogs run in a park near the river.",
    "He cooked pasta for dinner.",
]


def _embed(model_path: str, calls: list[int]):
    """The module's embedding function, counting its calls (and their sizes) in `calls`."""
    from transformers import AutoTokenizer

    from distributed_emb.model.embedder import embed_module
    from distributed_emb.model.encoder import TrainableEncoder

    torch.manual_seed(0)
    encoder = TrainableEncoder(model_path, pooler="mean", mlp_head=False).double()
    tokenizer = AutoTokenizer.from_pretrained(model_path)

    def embed(part: list[str]) -> np.ndarray:
        calls.append(len(part))
        return embed_module(encoder, tokenizer, part, 32, batch_size=2)

    return embed


SIZES = (7, 1)  # an uneven split; fewer sentences than ranks


def _worker(rank: int, world: int, init_file: str, model_path: str, out_dir: str):
    """Both sizes in one pair of processes: a spawned process's start (importing torch and
    transformers, joining the group) costs more than both sizes' embedding; the model is
    built afresh for each size, with the same seed."""
    from distributed_emb import distributed

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    for n in SIZES:
        calls: list[int] = []
        embed = _embed(model_path, calls)
        result = distributed.map_sharded(SENTENCES[:n], embed, order_key=len)
        np.save(os.path.join(out_dir, f"rank{rank}_n{n}.npy"), result)
        np.save(os.path.join(out_dir, f"calls{rank}_n{n}.npy"), np.array(calls))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def sharded(tiny_bert_path, tmp_path_factory):
    """The directory where both ranks saved, for each size, what they embedded and their
    calls."""
    out = tmp_path_factory.mktemp("sharded")
    mp.spawn(_worker, args=(2, str(out / "init"), tiny_bert_path, str(out)), nprocs=2, join=True)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("n", SIZES)
def test_two_ranks_embed_what_one_process_embeds(sharded, tiny_bert_path, n):
    reference = _embed(tiny_bert_path, [])(SENTENCES[:n])  # (n, d)
    for rank in range(2):
        got = np.load(sharded / f"rank{rank}_n{n}.npy")
        assert got.shape == reference.shape
        # Padding differs from the one-process batches: equal up to float64 noise.
        np.testing.assert_allclose(got, reference, rtol=0, atol=1e-10)
    # Rows are distinct, so a permutation could not pass the check above.
    assert np.unique(reference.round(6), axis=0).shape[0] == n
    calls = [np.load(sharded / f"calls{rank}_n{n}.npy").tolist() for rank in range(2)]
    assert calls[0] == calls[1] == [-(-n // 2)], calls  # one call each, of equal size


def test_one_process_computes_everything_itself():
    from distributed_emb import distributed

    seen = []
    out = distributed.map_sharded(["a", "bb"], lambda xs: seen.append(xs) or np.ones((2, 3)))
    assert seen == [["a", "bb"]] and out.shape == (2, 3)
