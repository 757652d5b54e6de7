"""Peak resident memory of one worker's training step, measured in a fresh process.

    python -m bench.memory --model DIR --batch 32 --seq 32 --threads 1

Builds what a Ray Train worker builds (the project's TrainableEncoder, the DDP engine with its
AdamW state, the real step from train/step.py) and runs steps on full-length batches (every
row `seq` tokens: the worst case dynamic padding can meet), then prints one JSON line:
the RSS after building (weights), and the peak (VmHWM) after the steps (weights,
gradients, Adam moments, activations). A fresh process per batch size, because the high-water
mark never goes down.
"""

from __future__ import annotations

import argparse
import json
import os

from distributed_emb.train.loop import peak_rss_mb  # VmHWM, as the workers report


def rss_mb() -> float:
    """Current resident memory (from /proc/self/statm pages)."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 1024**2


def measure(model_path: str, batch: int, seq: int, threads: int, steps: int) -> dict:
    import torch
    import transformers

    from distributed_emb.config import TrainLoopConfig
    from distributed_emb.losses.objective import LossConfig
    from distributed_emb.model.encoder import TrainableEncoder
    from distributed_emb.train.engine import build_engine
    from distributed_emb.train.step import plain_step

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    encoder = TrainableEncoder(model_path, pooler="mean", mlp_head=True)
    encoder.train()
    engine = build_engine(encoder, TrainLoopConfig(batch_size=batch), steps, torch.device("cpu"))
    weights = LossConfig(temperature=0.05, reconstruction_weight=0.1)
    built = rss_mb()
    vocab = encoder.backbone.config.vocab_size
    ids = torch.randint(1000, vocab, (batch, seq))
    tensors = {
        "input_ids": torch.cat([ids, ids]),  # (2B, L)
        "attention_mask": torch.ones(2 * batch, seq, dtype=torch.long),
    }
    for _ in range(steps):
        plain_step(engine, tensors, weights, sync=True)
        engine.step()
    return {"batch": batch, "seq": seq, "built_mb": built, "peak_mb": peak_rss_mb()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    print(json.dumps(measure(args.model, args.batch, args.seq, args.threads, args.steps)))


if __name__ == "__main__":
    main()
