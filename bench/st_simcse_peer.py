"""Train the peer the quality tables compare with: sentence-transformers' unsupervised SimCSE
recipe (`MultipleNegativesRankingLoss` on (s, s) pairs, scale 1/τ) at the default InforMin-CL
run's budget, and save the model for `jobs/evaluate.py`.

    python -m bench.st_simcse_peer --output outputs/peer_st_simcse [--steps 200] [--batch 64]

Equal budget with `python jobs/train_informin.py`: the packaged all-MiniLM-L6-v2, 200 optimizer
steps of 64 sentences (12,800 sentences, drawn with a fixed seed from the shipped Wikipedia
sentences), 32 tokens, learning rate 1e-5 with linear decay, τ = 0.05. The step is
bench/baselines.py's `SentenceTransformersRecipe` (the library's collator and loss module, the
Hugging Face trainer's optimizer defaults), so the peer is trained exactly as that benchmark
times it. The saved directory is a plain sentence-transformers model (pooling and Normalize as
the packaged model has them).
"""

from __future__ import annotations

import argparse
import os
import random
import time


def sample_sentences(path: str, count: int, seed: int) -> list[str]:
    """`count` sentences of the corpus at `path`, in a seeded random order (with repeats only
    when the corpus is smaller than `count`)."""
    with open(path, encoding="utf-8") as handle:
        sentences = [line.strip() for line in handle if line.strip()]
    rng = random.Random(seed)
    order: list[str] = []
    while len(order) < count:
        epoch = list(sentences)
        rng.shuffle(epoch)
        order.extend(epoch)
    return order[:count]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="where the trained model is saved")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=1e-5)
    parser.add_argument("--temperature", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    import torch

    from bench.baselines import SentenceTransformersRecipe
    from distributed_emb.paths import default_model_path, shipped_corpus

    torch.set_num_threads(os.cpu_count() or 1)
    recipe = SentenceTransformersRecipe(
        default_model_path(),
        args.seq,
        args.learning_rate,
        args.temperature,
        args.steps,
        seed=args.seed,
    )
    sentences = sample_sentences(
        shipped_corpus("wiki_sentences.txt"), args.steps * args.batch, args.seed
    )
    started = time.time()
    for step in range(args.steps):
        recipe.step(sentences[step * args.batch : (step + 1) * args.batch])
        if (step + 1) % 50 == 0:
            print(f"step {step + 1}/{args.steps} {time.time() - started:.0f} s", flush=True)
    recipe.model.eval()
    recipe.model.save(args.output)
    print(f"saved to {args.output} ({time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
