"""ONNX graphs (fp32, int8) against the torch model: sentences per second on one machine.

    python -m bench.onnx_export [--rounds 3] [--sentences 1000] [--batch-size 128] [--threads N]

The packaged all-MiniLM-L6-v2, copied to a scratch directory and exported there
(model/onnx_export.py: fp32 and int8 graphs), then the first N distinct STS-B dev sentences
embedded by three arms with the same batch size and the same number of threads:

- `torch`: the project's Embedder (SentenceTransformer.encode), torch.set_num_threads(N);
- `onnx_fp32`, `onnx_int8`: OnnxEmbedder on each graph, onnxruntime with N intra-op threads.

Models are loaded before the clock starts (a server loads once); each arm embeds 8 sentences
first (first-call costs), then the arms run interleaved round by round on a shared machine.
Each arm's vectors are compared with torch's (mean and worst row cosine), so a fast arm is
never a wrong one unseen. Prints one JSON object: wall and CPU seconds per arm and round (this
process's CPU time, all its threads: on a machine others load, the wall clock also counts their
work), sentences/s of each, and each arm's speed divided by torch's in the same round.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

# First: importing it sets the jobs' environment defaults (hub offline) before the imports
# below bring in the hub client, which reads them once.
from distributed_emb.runtime import environment_defaults  # isort: skip
from distributed_emb.evaluation.sts import pair_cosines, read_stsb
from distributed_emb.model.embedder import Embedder
from distributed_emb.model.onnx_embedder import OnnxEmbedder
from distributed_emb.model.onnx_export import export_onnx
from distributed_emb.paths import default_model_path


def dev_sentences(limit: int) -> list[str]:
    data = read_stsb("dev")
    return list(dict.fromkeys(data.sentences1 + data.sentences2))[:limit]


def rates(seconds: dict[str, list[float]], sentences: int) -> dict:
    """Seconds per arm and round, the median sentences/s, and the median of each round's rate
    divided by torch's in the same round (equal sentences: the time ratio)."""
    baseline = seconds["torch"]
    return {
        "seconds": {name: [round(s, 2) for s in values] for name, values in seconds.items()},
        "sentences_per_s_median": {
            name: round(sentences / statistics.median(values), 1)
            for name, values in seconds.items()
        },
        "speed_vs_torch_median": {
            name: round(statistics.median(b / s for b, s in zip(baseline, values)), 2)
            for name, values in seconds.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--model", default=None, help="default: the packaged MiniLM")
    args = parser.parse_args(argv)
    environment_defaults()
    sentences = dev_sentences(args.sentences)
    with tempfile.TemporaryDirectory() as scratch:
        model = Path(scratch) / "model"
        shutil.copytree(args.model or default_model_path(), model)  # the package stays as is
        started = time.perf_counter()
        export_onnx(model)
        export_s = time.perf_counter() - started
        arms = {
            "torch": Embedder(str(model), batch_size=args.batch_size, torch_threads=args.threads),
            "onnx_fp32": OnnxEmbedder(model, "fp32", args.batch_size, args.threads),
            "onnx_int8": OnnxEmbedder(model, "int8", args.batch_size, args.threads),
        }
        sizes_mib = {
            name: round(arm.path.stat().st_size / 2**20, 1)
            for name, arm in arms.items()
            if isinstance(arm, OnnxEmbedder)
        }
        load_start = round(os.getloadavg()[0], 1)
        for arm in arms.values():  # first-call costs, paid by no timed round
            arm.embed(sentences[:8])
        seconds: dict[str, list[float]] = {name: [] for name in arms}
        cpu_seconds: dict[str, list[float]] = {name: [] for name in arms}
        vectors: dict[str, np.ndarray] = {}
        for _ in range(args.rounds):
            for name, arm in arms.items():
                started, cpu_started = time.perf_counter(), time.process_time()
                vectors[name] = arm.embed(sentences)
                seconds[name].append(time.perf_counter() - started)
                cpu_seconds[name].append(time.process_time() - cpu_started)
    agreement = {
        name: pair_cosines(vectors[name], vectors["torch"]) for name in arms if name != "torch"
    }
    result = {
        "sentences": len(sentences),
        "batch_size": args.batch_size,
        "threads": args.threads,
        "export_s": round(export_s, 1),
        "graph_mib": sizes_mib,
        "wall": rates(seconds, len(sentences)),
        "cpu": rates(cpu_seconds, len(sentences)),
        "cosine_to_torch": {
            name: {"mean": round(float(c.mean()), 4), "min": round(float(c.min()), 4)}
            for name, c in agreement.items()
        },
        "load_average_1min": {"start": load_start, "end": round(os.getloadavg()[0], 1)},
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
