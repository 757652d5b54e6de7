"""The corpus embedding job against sentence-transformers' own multi-process encode, one machine.

    python -m bench.embed [--json] [--rows 4000] [--block-rows 500] [--rounds 2] \
        [--processes P] [--model DIR]

The first `--rows` clean rows of the shipped Wikipedia sentences (what the job's reader keeps),
the packaged all-MiniLM-L6-v2 at its own max length, batch 128, P processes (default: one per
core) in every multi-process arm. Each arm from loading the model to the last vector,
interleaved round by round:

- `embed_job`: vectors/corpus_embedding.py `embed_corpus` as jobs/embed.py runs it once Ray is
  up (Ray's start is not timed, as in bench/encoding.py): P encoding actors of one torch thread
  each, reading the corpus file, embedding and writing float32 shards (text included) and the
  manifest into a fresh directory; blocks of `--block-rows` lines, so that every actor has
  several (a real corpus has thousands of 10,000-line blocks);
- `st_multi_process`: `SentenceTransformer.start_multi_process_pool(["cpu"] * P)` then
  `encode(sentences, pool=pool)`, what sentence-transformers offers for several CPU processes;
  its workers keep torch's default threads (every core each), as a user's would;
- `st_multi_process_1_thread`: the same with OMP_NUM_THREADS=1 in the workers, so that the P
  processes share the cores as the job's actors do (the baseline's better setting here);
- `st_one_process`: plain `SentenceTransformer.encode` in this process, every core: the
  reference a single machine is best served by.

Every arm runs once on 64 rows first (imports, first calls). Each arm's vectors are checked
against `st_one_process`'s row by row (cosine ≥ 0.9999; the job's by id), so a fast arm cannot
be a wrong one. Prints one JSON object (with `--json`, alone): rows/s per arm and round, and
each arm's median rate divided by `st_multi_process`'s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

# First: importing it sets the jobs' environment defaults (hub offline) before the imports
# below bring in the hub client, which reads them once.
from distributed_emb.runtime import environment_defaults  # isort: skip
from bench.encoding import cosine_rows
from bench.machine import describe_machine, load_now
from distributed_emb.config import load_config
from distributed_emb.data.corpus import read_rows
from distributed_emb.paths import default_model_path, shipped_corpus
from distributed_emb.tables import markdown_table
from distributed_emb.vectors.embed_config import EmbedJobConfig

BATCH = 128
BASELINE = "st_multi_process"


def corpus_rows(rows: int) -> list[str]:
    """The first `rows` clean rows of the shipped sentences, as the job's reader keeps them."""
    texts, _ = read_rows(shipped_corpus("wiki_sentences.txt"), max_rows=rows)
    return texts["text"]


def embed_job_arm(
    model: str, texts: list[str], processes: int, block_rows: int, scratch: Path
) -> np.ndarray:
    from distributed_emb.vectors.corpus_embedding import embed_corpus

    out = Path(tempfile.mkdtemp(dir=scratch))
    config = load_config(
        EmbedJobConfig,
        overrides=[
            f"data.max_rows={len(texts)}",
            f"embed.concurrency={processes}",
            "embed.torch_threads=1",
            f"embed.batch_size={BATCH}",
            f"embed.block_rows={block_rows}",
        ],
        values={"model.path": model, "embed.output_dir": str(out)},
    )
    embed_corpus(config)
    manifest = json.loads((out / "manifest.json").read_text())
    import pyarrow.parquet as pq

    parts = [pq.read_table(out / s["file"], columns=["embedding"]) for s in manifest["shards"]]
    vectors = np.concatenate(
        [np.stack(p.column("embedding").to_numpy(zero_copy_only=False)) for p in parts]
    )  # (n, d) in id order: the order of `texts`
    shutil.rmtree(out)
    return vectors


@contextmanager
def _environment(name: str, value: str | None):
    before = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def st_pool_arm(model: str, texts: list[str], processes: int, threads: str | None) -> np.ndarray:
    from sentence_transformers import SentenceTransformer  # startup

    encoder = SentenceTransformer(model, device="cpu")
    with _environment("OMP_NUM_THREADS", threads):  # read by each spawned worker's torch
        pool = encoder.start_multi_process_pool(["cpu"] * processes)
    try:
        return encoder.encode(texts, batch_size=BATCH, pool=pool, show_progress_bar=False)
    finally:
        encoder.stop_multi_process_pool(pool)


def st_one_process_arm(model: str, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer  # startup

    encoder = SentenceTransformer(model, device="cpu")
    return encoder.encode(texts, batch_size=BATCH, show_progress_bar=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--block-rows", type=int, default=500, help="lines per shard")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--model", default=None, help="default: the packaged MiniLM")
    args = parser.parse_args(argv)
    environment_defaults()
    import ray  # startup

    from distributed_emb.console import quiet_ray_data

    model = args.model or default_model_path()
    texts = corpus_rows(args.rows)
    processes = args.processes
    scratch = Path(tempfile.mkdtemp(prefix="bench_embed_"))
    arms = {
        "embed_job": lambda t: embed_job_arm(model, t, processes, args.block_rows, scratch),
        BASELINE: lambda t: st_pool_arm(model, t, processes, None),
        "st_multi_process_1_thread": lambda t: st_pool_arm(model, t, processes, "1"),
        "st_one_process": lambda t: st_one_process_arm(model, t),
    }
    quiet_ray_data()
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False)
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    load = {"start": load_now()}
    try:
        for arm in arms.values():  # imports and first-call costs, paid by no timed arm
            arm(texts[:64])
        for _ in range(args.rounds):
            vectors = {}
            for name, arm in arms.items():
                started = time.perf_counter()
                vectors[name] = np.asarray(arm(texts), dtype=np.float32)
                seconds[name].append(time.perf_counter() - started)
            for name, found in vectors.items():
                worst = float(cosine_rows(found, vectors["st_one_process"]).min())
                if found.shape != vectors["st_one_process"].shape or worst < 0.9999:
                    raise SystemExit(f"{name}: a vector differs from the reference (cos {worst})")
    finally:
        ray.shutdown()
        shutil.rmtree(scratch, ignore_errors=True)
    load["end"] = load_now()
    rates = {name: [len(texts) / s for s in values] for name, values in seconds.items()}
    baseline = statistics.median(rates[BASELINE])
    result = {
        "rows": len(texts),
        "processes": processes,
        "block_rows": args.block_rows,
        "model": model,
        "seconds": {name: [round(s, 1) for s in values] for name, values in seconds.items()},
        "rows_per_s": {name: round(statistics.median(r), 1) for name, r in rates.items()},
        "vs_st_multi_process": {
            name: round(statistics.median(r) / baseline, 2) for name, r in rates.items()
        },
        "load_average": load,
        "machine": describe_machine(),
    }
    if not args.json:
        print(
            markdown_table(
                ["arm", "rows/s (median)", f"× {BASELINE}", "seconds per round"],
                [
                    [
                        name,
                        f"{result['rows_per_s'][name]:.0f}",
                        f"{result['vs_st_multi_process'][name]:.2f}×",
                        ", ".join(f"{s:.1f}" for s in result["seconds"][name]),
                    ]
                    for name in arms
                ],
                right_aligned="-rr-",
            )
        )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
