"""Evaluation encoding against `SentenceTransformer.encode`, on one machine.

    python -m bench.encoding [--rounds 2] [--sentences N]

The distinct sentences of the shipped STS-B dev and test sets (what `jobs/evaluate.py` embeds
for STS-B), the packaged all-MiniLM-L6-v2 at its own max length, batch 128. Three arms, each
from loading the model to the last vector, interleaved round by round on a shared machine:

- `sentence_transformers`: `SentenceTransformer(path).encode(...)`, what a user would write;
- `in_process`: the project's encoder as `encode.use_ray=auto` runs it on one machine
  (`make_encoder(use_ray=False)`: the model loaded once in this process, every core);
- `ray_pool`: the project's Ray Data actor pool (`encode.use_ray=true`, one actor, its default
  CPU share), Ray already running (a job starts it once), the actor's start and model load
  included.

Each arm runs once on 8 sentences before the timed rounds (imports, first calls). Each arm's
vectors are checked against the sentence-transformers ones (cosine ≥ 0.9999), so a
fast arm cannot be a wrong one. Prints one JSON object: seconds per arm and round, and each
arm's sentences/s divided by sentence-transformers' in the same round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

# First: importing it sets the jobs' environment defaults (hub offline) before the imports
# below bring in the hub client, which reads them once.
from distributed_emb.runtime import environment_defaults  # isort: skip
from distributed_emb.evaluation.senteval_data import read_sts_benchmark
from distributed_emb.model.embedder import make_encoder, ray_encode
from distributed_emb.paths import default_model_path, shipped_senteval_dir

BATCH = 128


def stsb_sentences(limit: int | None) -> list[str]:
    sentences: list[str] = []
    for split in ("dev", "test"):
        data = read_sts_benchmark(shipped_senteval_dir(), split)
        sentences += data.sentences1 + data.sentences2
    distinct = list(dict.fromkeys(sentences))
    return distinct[:limit] if limit else distinct


def sentence_transformers_arm(model: str, sentences: list[str], pooler: str | None) -> np.ndarray:
    # A plain HF directory gets sentence-transformers' default, mean pooling (give --pooler mean).
    from sentence_transformers import SentenceTransformer  # startup

    encoder = SentenceTransformer(model, device="cpu")
    return encoder.encode(sentences, batch_size=BATCH, show_progress_bar=False)


def in_process_arm(model: str, sentences: list[str], pooler: str | None) -> np.ndarray:
    return make_encoder(model, pooler, batch_size=BATCH, use_ray=False)(sentences)


def ray_pool_arm(model: str, sentences: list[str], pooler: str | None) -> np.ndarray:
    return ray_encode(sentences, model, pooler=pooler, batch_size=BATCH)


ARMS = {
    "sentence_transformers": sentence_transformers_arm,
    "in_process": in_process_arm,
    "ray_pool": ray_pool_arm,
}


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(axis=1)  # (n,)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sentences", type=int, default=None, help="first N (default: all)")
    parser.add_argument("--model", default=None, help="default: the packaged MiniLM")
    parser.add_argument(
        "--pooler", default=None, help="our pooler for a plain HF model (default: as saved)"
    )
    args = parser.parse_args(argv)
    environment_defaults()
    import ray  # startup

    model = args.model or default_model_path()
    sentences = stsb_sentences(args.sentences)
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False)
    seconds: dict[str, list[float]] = {name: [] for name in ARMS}
    reference = None
    try:
        for arm in ARMS.values():  # imports and first-call costs, paid by no timed arm
            arm(model, sentences[:8], args.pooler)
        for _ in range(args.rounds):
            for name, arm in ARMS.items():
                started = time.perf_counter()
                vectors = np.asarray(arm(model, sentences, args.pooler), dtype=np.float32)
                seconds[name].append(time.perf_counter() - started)
                if reference is None:
                    reference = vectors
                worst = float(cosine_rows(vectors, reference).min())
                if worst < 0.9999:
                    raise SystemExit(f"{name}: a vector differs from the reference (cos {worst})")
    finally:
        ray.shutdown()
    baseline = seconds["sentence_transformers"]
    result = {
        "sentences": len(sentences),
        "seconds": {name: [round(s, 1) for s in values] for name, values in seconds.items()},
        # Rate ÷ sentence-transformers' rate in the same round (equal sentences: time ratio).
        "speed_vs_sentence_transformers": {
            name: [round(b / s, 2) for b, s in zip(baseline, values)]
            for name, values in seconds.items()
        },
        "median_speed_vs_sentence_transformers": {
            name: round(statistics.median(b / s for b, s in zip(baseline, values)), 2)
            for name, values in seconds.items()
        },
        "load_average_1min": round(os.getloadavg()[0], 1),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
