"""The speed changes one at a time, A/B at the granularity of single steps, in one process.

On a shared machine the load drifts within seconds, so comparing whole runs minutes apart
cannot resolve a 5% change. Here every variant holds its own copy of the model and engine and
the variants take turns step by step over the same pool of sentences; each variant's speed is
its real tokens over its own summed step time. The step is the project's (collator,
`plain_step`, `engine.step()`), as a Ray Train worker runs it, minus Ray.

Variants:
- default: fp32, random batches, fused AdamW (the project's engine today);
- before: the same with `torch.optim.AdamW`'s default per-parameter update (the engine before
  the speed work);
- length-grouped: the same sentences batched by `LengthGroupedCollator` (pool = all batches);
- bf16: `train.precision=bf16` autocast (losses stay fp32);
- compiled (not in the bench's section 7, compiling takes minutes): `train.compile=true`.

    python -m bench.step_ab --variants default,compiled --steps 16   # compile A/B alone
"""

from __future__ import annotations

import time

DEFAULT = "fp32, random batches, fused AdamW (default)"
BEFORE = "fp32, random batches, per-parameter AdamW (before)"
GROUPED = "fp32, length-grouped batches, fused AdamW (data.length_group_batches)"
BF16 = "bf16 autocast, random batches, fused AdamW (train.precision=bf16)"
COMPILED = "fp32, random batches, fused AdamW, compiled encoder (train.compile=true)"
VARIANTS = (DEFAULT, BEFORE, GROUPED, BF16)
SHORT_NAMES = {"default": DEFAULT, "before": BEFORE, "grouped": GROUPED, "bf16": BF16,
               "compiled": COMPILED}  # fmt: skip


def step_ab(
    model_path: str,
    batches: list[list[str]],
    seq: int,
    threads: int,
    variants: tuple[str, ...] = VARIANTS,
) -> dict:
    """One warm-up step per variant on `batches[0]`, then each of `batches[1:]` (regrouped by
    length for the grouped variant) with the variants taking turns. The compiled variant
    first meets every padded batch length it will be timed on, so no compiling is timed."""
    import numpy as np
    import torch
    import transformers
    from transformers import AutoTokenizer

    from distributed_emb.config import TrainLoopConfig
    from distributed_emb.data.collate import ContrastiveCollator
    from distributed_emb.data.global_batches import length_groups
    from distributed_emb.losses.objective import LossConfig
    from distributed_emb.model.encoder import TrainableEncoder
    from distributed_emb.train.engine import build_engine
    from distributed_emb.train.optim import build_optimizer, build_scheduler
    from distributed_emb.train.step import plain_step

    transformers.logging.set_verbosity_error()
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    collate = ContrastiveCollator(AutoTokenizer.from_pretrained(model_path), seq)
    size = len(batches[0])
    warm = collate({"text": np.array(batches[0], dtype=object)})
    plain = [collate({"text": np.array(t, dtype=object)}) for t in batches[1:]]
    pool = np.array([t for texts in batches[1:] for t in texts], dtype=object)
    # The product's grouping (data/global_batches.py), by characters as for untokenised text.
    order = np.random.default_rng(0).permutation(len(pool) // size)
    groups = length_groups(np.array([len(t) for t in pool]), size, order)
    grouped = [collate({"text": pool[rows]}) for rows in groups]
    inputs = {DEFAULT: plain, BEFORE: plain, GROUPED: grouped, BF16: plain, COMPILED: plain}
    weights = LossConfig(temperature=0.05, reconstruction_weight=0.1)

    engines = {}
    for name in variants:
        torch.manual_seed(0)
        encoder = TrainableEncoder(model_path, pooler="mean", mlp_head=True)
        encoder.train()
        warm_up = [warm]
        if name == COMPILED:
            encoder.compile_backbone()
            multiple = encoder.pad_to_multiple_of
            lengths = {-(-b["input_ids"].shape[1] // multiple): b for b in plain}  # one a shape
            warm_up = list(lengths.values())
        train = TrainLoopConfig(batch_size=size, precision="bf16" if name == BF16 else "fp32")
        engine = build_engine(encoder, train, 10_000, torch.device("cpu"))
        if name == BEFORE:
            engine.optimizer = build_optimizer(engine.module, train)  # not fused
            engine.scheduler = build_scheduler(engine.optimizer, 10_000, train)
        for batch in warm_up:
            plain_step(engine, batch, weights, sync=True)
            engine.step()
        engines[name] = engine

    seconds = {name: 0.0 for name in variants}
    tokens = {name: 0 for name in variants}
    padded = {name: 0 for name in variants}
    optimizer_seconds = {name: 0.0 for name in variants}
    for index in range(len(plain)):
        for name in variants[index % len(variants) :] + variants[: index % len(variants)]:
            batch, engine = inputs[name][index], engines[name]
            started = time.perf_counter()
            plain_step(engine, batch, weights, sync=True)
            stepped = time.perf_counter()
            engine.step()
            ended = time.perf_counter()
            seconds[name] += ended - started
            optimizer_seconds[name] += ended - stepped
            tokens[name] += int(batch["num_real_tokens"])
            padded[name] += batch["attention_mask"].numel()
    torch.set_num_threads(previous)
    steps = len(plain)
    return {
        name: {
            "ms_per_step": 1000 * seconds[name] / steps,
            "optimizer_ms_per_step": 1000 * optimizer_seconds[name] / steps,
            "tokens_per_s": tokens[name] / seconds[name],
            "padding": 1 - tokens[name] / padded[name],
            "steps": steps,
        }
        for name in variants
    }


def main() -> None:
    import argparse
    import json

    from distributed_emb.paths import default_model_path, shipped_corpus

    parser = argparse.ArgumentParser(description="A/B the speed changes step by step.")
    parser.add_argument("--variants", default="default,compiled", help=",".join(SHORT_NAMES))
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    variants = tuple(SHORT_NAMES[v] for v in args.variants.split(","))
    with open(shipped_corpus("wiki_sentences.txt"), encoding="utf-8") as f:
        texts = [line.strip() for line in f if line.strip()][: (args.steps + 1) * args.batch]
    batches = [texts[i : i + args.batch] for i in range(0, len(texts), args.batch)]
    result = step_ab(default_model_path(), batches, args.seq, args.threads, variants)
    baseline = result[variants[0]]["tokens_per_s"]
    for name in variants:
        row = result[name]
        print(json.dumps({"variant": name, **row, "x_first": row["tokens_per_s"] / baseline}))


if __name__ == "__main__":
    main()
