"""Where a training step's time goes: the project's step under torch.profiler.

    python -m bench.profile_step [--model DIR] [--batch 32] [--seq 32] [--threads 1]

What each Ray Train worker runs per step, in this process (no Ray, so the profile holds only
the step itself): the worker's collator on real corpus sentences, `plain_step` (one forward of
2B rows, the InforMin-CL objective, backward) and `engine.step()` (clipping, AdamW, schedule).
Prints the phases and the top operators by self CPU time.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PHASES = ("collate", "forward+loss", "backward", "optimizer")


def profile_step(
    model_path: str, batches: list[list[str]], seq: int, threads: int, top: int = 10
) -> dict:
    """Profile `len(batches) - 1` steps after one warm-up step; phases and top operators."""
    import numpy as np
    import torch
    import transformers
    from torch.profiler import ProfilerActivity, profile, record_function
    from transformers import AutoTokenizer

    from distributed_emb.config import TrainLoopConfig
    from distributed_emb.data.collate import ContrastiveCollator
    from distributed_emb.losses.objective import LossConfig
    from distributed_emb.model.encoder import TrainableEncoder
    from distributed_emb.train.engine import build_engine
    from distributed_emb.train.step import forward_objective

    transformers.logging.set_verbosity_error()
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    encoder = TrainableEncoder(model_path, pooler="mean", mlp_head=True)
    encoder.train()
    train = TrainLoopConfig(batch_size=len(batches[0]))
    engine = build_engine(encoder, train, len(batches), torch.device("cpu"))
    weights = LossConfig(temperature=0.05, reconstruction_weight=0.1)
    collate = ContrastiveCollator(AutoTokenizer.from_pretrained(model_path), seq)

    def step(texts: list[str]) -> None:
        # plain_step's body, split so each phase is its own profiler range.
        with record_function("collate"):
            batch = collate({"text": np.array(texts, dtype=object)})
        with record_function("forward+loss"):
            loss, _ = forward_objective(engine.forward_module, batch, weights)
        with record_function("backward"):
            engine.backward(loss)
        with record_function("optimizer"):
            engine.step()

    step(batches[0])
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        for texts in batches[1:]:
            step(texts)
    torch.set_num_threads(previous)
    steps = len(batches) - 1
    events = profiler.key_averages()
    phase_ms = {e.key: e.cpu_time_total / 1000 / steps for e in events if e.key in PHASES}
    step_ms = sum(phase_ms.values())
    operators = sorted(
        (e for e in events if e.key not in PHASES and not e.key.startswith("ProfilerStep")),
        key=lambda e: e.self_cpu_time_total,
        reverse=True,
    )[:top]
    return {
        "steps": steps,
        "step_ms": step_ms,
        "phases": [
            {
                "phase": p,
                "ms_per_step": phase_ms.get(p, 0.0),
                "share": phase_ms.get(p, 0.0) / step_ms if step_ms else 0.0,
            }
            for p in PHASES
        ],
        "top_operators": [
            {
                "operator": e.key,
                "calls_per_step": e.count / steps,
                "self_ms_per_step": e.self_cpu_time_total / 1000 / steps,
                "share": e.self_cpu_time_total / 1000 / steps / step_ms if step_ms else 0.0,
            }
            for e in operators
        ],
    }


def main() -> None:
    from distributed_emb.paths import default_model_path, shipped_corpus

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    lines = Path(shipped_corpus("wiki_sentences.txt")).read_text().splitlines()
    batches = [lines[i * args.batch : (i + 1) * args.batch] for i in range(args.steps + 1)]
    result = profile_step(args.model or default_model_path(), batches, args.seq, args.threads)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
