"""The corpus embedding job against sentence-transformers on one machine, sentences and documents.

    python -m bench.embed [--json] [--rows 4000] [--documents 1000] [--rounds 2] \
        [--block-rows 500] [--processes P] [--model DIR] [--pooler mean] [--arms A,B,...] [--small]

Two corpora, each embedded by every arm:

- `sentences`: the first `--rows` clean rows of the shipped Wikipedia sentences (what the job's
  reader keeps), about 30 tokens each;
- `documents`: `--documents` passages of the shipped Wikipedia articles
  (resources/corpus/wiki_documents.jsonl), consecutive sentences joined up to a length drawn
  between 300 and 1,600 characters (seed 0), so from about 70 tokens to past the model's
  256-token limit: long rows of mixed lengths, where a batch that is not sorted by length pads
  most.

The packaged all-MiniLM-L6-v2 at its own max length, batch 32 (`encode`'s default and the
job's), P processes (default: one per core) in the multi-process arm. Each arm from loading the
model to the last vector, interleaved round by round:

- `embed_job`: vectors/corpus_embedding.py `embed_corpus` as jobs/embed.py runs it once Ray is
  up (Ray's start is not timed, as in bench/encoding.py), with the layout it chooses by itself
  (vectors/embed_layout.py: on one machine one actor, every core as its threads) and its
  default number format (embed.compute_dtype=auto: bfloat16 on a CPU with AMX): reading the
  corpus file, embedding and writing float32 shards (text included) and the manifest into a
  fresh directory, blocks of `--block-rows` lines;
- `embed_job_onnx_int8`: the same with `embed.backend=onnx_int8` (the int8 ONNX graph through
  onnxruntime); the graph is exported and checked into a cache the first (untimed) run fills,
  as a user's first run does, and read from there by every timed one;
- `st_one_process`: plain `SentenceTransformer.encode` in this process, every core: the
  baseline, what a single machine is best served by without the job;
- `st_multi_process`: `SentenceTransformer.start_multi_process_pool(["cpu"] * P)` then
  `encode(sentences, pool=pool)`, what sentence-transformers offers for several processes; its
  workers keep torch's default threads, as a user's would.

`--arms` adds (or picks) others: `embed_job_float32` (the job in float32 whatever the CPU),
`embed_job_actor_per_core` (the job's layout before it chose one: P actors of one torch
thread), `embed_job_onnx` (the fp32 graph), `st_one_process_bfloat16` (the baseline under
``torch.autocast("cpu", dtype=torch.bfloat16)``, what a user could do by hand) and
`st_multi_process_1_thread` (OMP_NUM_THREADS=1 in the pool's workers).

Every arm runs once on 64 rows of each corpus first (imports, first calls, the graph's export:
`warmup_s`). Each arm's vectors are checked against `st_one_process`'s row by row (the job's by
id), so a fast arm cannot be a wrong one: torch arms to a cosine of 0.9999, the fp32 graph to
0.999, the int8 graph by the export check's least mean cosine (0.97). Prints one JSON object
(with `--json`, alone): per corpus, rows/s per arm and round, each arm's median rate divided
by `st_one_process`'s, the cosines, the documents' token lengths, and what
`embed.compute_dtype=auto` chose on this CPU (`compute_dtype_auto`). `--small`: a few rows of
each corpus, one round, no warm-up: the smoke test's size (tests/bench/test_bench_smoke.py).
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
from distributed_emb.model.compute_dtype import resolve_compute_dtype
from distributed_emb.model.onnx_config import minimum_mean_cosine
from distributed_emb.paths import default_model_path, shipped_corpus
from distributed_emb.tables import markdown_table
from distributed_emb.vectors.embed_config import EmbedJobConfig

BATCH = 32  # sentence-transformers' encode default, and the embed job's (embed.batch_size)
BASELINE = "st_one_process"
DEFAULT_ARMS = ("embed_job", "embed_job_onnx_int8", BASELINE, "st_multi_process")
OTHER_ARMS = (
    "embed_job_float32",
    "embed_job_actor_per_core",
    "embed_job_onnx",
    "st_one_process_bfloat16",
    "st_multi_process_1_thread",
)
# Least row cosine with the baseline's vectors per arm (the int8 graph: least mean cosine).
LEAST_COSINE = {"embed_job_onnx": 0.999}
PASSAGE_CHARS = (300, 1600)
WARMUP_ROWS = 64


def sentence_rows(rows: int) -> list[str]:
    """The first `rows` clean rows of the shipped sentences, as the job's reader keeps them."""
    texts, _ = read_rows(shipped_corpus("wiki_sentences.txt"), max_rows=rows)
    return texts["text"]


def write_documents(path: Path, count: int, seed: int = 0) -> list[str]:
    """`count` passages of the shipped Wikipedia articles written to `path` (one a line): each
    article's sentences joined in order until a length drawn from PASSAGE_CHARS; returns them
    as the job's reader keeps them."""
    rng = np.random.default_rng(seed)
    passages: list[str] = []
    with open(shipped_corpus("wiki_documents.jsonl"), encoding="utf-8") as articles:
        for line in articles:
            current, target = "", rng.integers(*PASSAGE_CHARS)
            for sentence in json.loads(line)["sentences"]:
                current = f"{current} {sentence}".strip()
                if len(current) >= target:
                    passages.append(current.replace("\n", " "))
                    current, target = "", rng.integers(*PASSAGE_CHARS)
            if len(passages) >= count:
                break
    path.write_text("\n".join(passages[:count]) + "\n", encoding="utf-8")
    texts, _ = read_rows(str(path), max_rows=count)
    return texts["text"]


def embed_job_arm(
    model: str,
    pooler: str | None,
    corpus: str,
    texts: list[str],
    block_rows: int,
    scratch: Path,
    overrides: list[str],
) -> np.ndarray:
    from distributed_emb.vectors.corpus_embedding import embed_corpus

    out = Path(tempfile.mkdtemp(dir=scratch))
    config = load_config(
        EmbedJobConfig,
        overrides=[
            f"data.max_rows={len(texts)}",
            f"embed.batch_size={BATCH}",
            f"embed.block_rows={block_rows}",
            *([f"model.pooler={pooler}"] if pooler else []),
            *overrides,
        ],
        values={"model.path": model, "embed.output_dir": str(out), "data.path": corpus},
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


def st_one_process_arm(model: str, texts: list[str], dtype: str = "float32") -> np.ndarray:
    """`encode` in this process; `dtype` "bfloat16": under autocast (model/compute_dtype.py)."""
    from sentence_transformers import SentenceTransformer  # startup

    from distributed_emb.model.compute_dtype import computing_in

    encoder = SentenceTransformer(model, device="cpu")
    with computing_in(dtype, "cpu"):
        return encoder.encode(texts, batch_size=BATCH, show_progress_bar=False)


def make_arms(args, model: str, scratch: Path) -> dict:
    """name → fn(corpus file, texts) -> (n, d) vectors, for the arms asked for."""
    graphs = f"embed.graph_cache={scratch / 'graphs'}"  # filled by the first run

    def job(*overrides: str):
        return lambda corpus, texts: embed_job_arm(
            model, args.pooler, corpus, texts, args.block_rows, scratch, list(overrides)
        )

    every = {
        "embed_job": job(),
        "embed_job_onnx_int8": job("embed.backend=onnx_int8", graphs),
        "embed_job_onnx": job("embed.backend=onnx", graphs),
        "embed_job_float32": job("embed.compute_dtype=float32"),
        "embed_job_actor_per_core": job(
            f"embed.concurrency={args.processes}", "embed.torch_threads=1"
        ),
        BASELINE: lambda corpus, texts: st_one_process_arm(model, texts),
        "st_one_process_bfloat16": lambda corpus, texts: st_one_process_arm(
            model, texts, "bfloat16"
        ),
        "st_multi_process": lambda corpus, texts: st_pool_arm(model, texts, args.processes, None),
        "st_multi_process_1_thread": lambda corpus, texts: st_pool_arm(
            model, texts, args.processes, "1"
        ),
    }
    return {name: every[name] for name in args.arms}


def check_vectors(name: str, found: np.ndarray, reference: np.ndarray) -> dict:
    """The arm's row cosines with the baseline's; SystemExit where they disagree."""
    if found.shape != reference.shape:
        raise SystemExit(f"{name}: vectors {found.shape}, {BASELINE}'s {reference.shape}")
    cosines = cosine_rows(found, reference)
    mean, worst = float(cosines.mean()), float(cosines.min())
    if name.endswith("onnx_int8"):
        wrong = mean < minimum_mean_cosine("int8")
    else:
        wrong = worst < LEAST_COSINE.get(name, 0.9999)
    if wrong:
        raise SystemExit(f"{name}: vectors differ from {BASELINE}'s (cos {mean}, worst {worst})")
    return {"mean": round(mean, 5), "min": round(worst, 5)}


def token_lengths(model: str, texts: list[str]) -> dict:
    """The documents' token counts under the model's tokenizer, and its limit."""
    from sentence_transformers import SentenceTransformer  # startup

    encoder = SentenceTransformer(model, device="cpu")
    lengths = np.array([len(ids) for ids in encoder.tokenizer(texts)["input_ids"]])
    limit = encoder.max_seq_length
    cut = np.minimum(lengths, limit)
    return {
        "max_seq_length": limit,
        "mean": round(float(cut.mean()), 1),
        "median": float(np.median(cut)),
        "at_the_limit": round(float((lengths >= limit).mean()), 3),
    }


def measure(arms: dict, corpus: str, texts: list[str], rounds: int, warmup: bool) -> dict:
    """One corpus: each arm's warm-up, then `rounds` interleaved timed rounds, checked."""
    warmup_s = {}
    if warmup:
        with tempfile.TemporaryDirectory() as folder:
            first = Path(folder) / "warmup.txt"
            first.write_text("\n".join(texts[:WARMUP_ROWS]) + "\n", encoding="utf-8")
            for name, arm in arms.items():  # imports, first calls, the graph's export
                started = time.perf_counter()
                arm(str(first), texts[:WARMUP_ROWS])
                warmup_s[name] = round(time.perf_counter() - started, 1)
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    cosines = {}
    for _ in range(rounds):
        vectors = {}
        for name, arm in arms.items():
            started = time.perf_counter()
            vectors[name] = np.asarray(arm(corpus, texts), dtype=np.float32)
            seconds[name].append(time.perf_counter() - started)
        for name, found in vectors.items():
            cosines[name] = check_vectors(name, found, vectors[BASELINE])
    rates = {name: [len(texts) / s for s in values] for name, values in seconds.items()}
    baseline = statistics.median(rates[BASELINE])
    return {
        "rows": len(texts),
        "seconds": {name: [round(s, 1) for s in values] for name, values in seconds.items()},
        "rows_per_s": {name: round(statistics.median(r), 1) for name, r in rates.items()},
        f"vs_{BASELINE}": {
            name: round(statistics.median(r) / baseline, 2) for name, r in rates.items()
        },
        f"cosine_to_{BASELINE}": cosines,
        "warmup_s": warmup_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--rows", type=int, default=4000, help="shipped sentences")
    parser.add_argument("--documents", type=int, default=1000, help="passages of articles")
    parser.add_argument("--block-rows", type=int, default=500, help="lines per shard")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--model", default=None, help="default: the packaged MiniLM")
    parser.add_argument(
        "--pooler", default=None, help="model.pooler for a plain Hugging Face directory"
    )
    parser.add_argument(
        "--arms",
        type=lambda text: [a.strip() for a in text.split(",") if a.strip()],
        default=list(DEFAULT_ARMS),
        help=f"comma list of {', '.join(DEFAULT_ARMS + OTHER_ARMS)}",
    )
    parser.add_argument(
        "--small", action="store_true", help="48 sentences, 12 documents, 1 round, no warm-up"
    )
    args = parser.parse_args(argv)
    if args.small:
        args.rows, args.documents, args.rounds, args.block_rows = 48, 12, 1, 16
    unknown = sorted(set(args.arms) - set(DEFAULT_ARMS + OTHER_ARMS))
    if unknown or BASELINE not in args.arms:
        parser.error(f"--arms: unknown {unknown}" if unknown else f"--arms: needs {BASELINE}")
    environment_defaults()
    import ray  # startup

    from distributed_emb.console import quiet_ray_data

    model = args.model or default_model_path()
    scratch = Path(tempfile.mkdtemp(prefix="bench_embed_"))
    arms = make_arms(args, model, scratch)
    corpora = {
        "sentences": (shipped_corpus("wiki_sentences.txt"), sentence_rows(args.rows)),
    }
    documents = scratch / "documents.txt"
    corpora["documents"] = (str(documents), write_documents(documents, args.documents))
    quiet_ray_data()
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False)
    load = {"start": load_now()}
    results = {}
    try:
        for name, (corpus, texts) in corpora.items():
            results[name] = measure(arms, corpus, texts, args.rounds, warmup=not args.small)
            load[f"after {name}"] = load_now()
    finally:
        ray.shutdown()
        shutil.rmtree(scratch, ignore_errors=True)
    results["documents"]["tokens"] = token_lengths(model, corpora["documents"][1])
    result = {
        "corpora": results,
        "processes": args.processes,
        "block_rows": args.block_rows,
        "batch_size": BATCH,
        # What embed.compute_dtype=auto chose on this CPU, so the default's row is read right.
        "compute_dtype_auto": resolve_compute_dtype("auto", "cpu"),
        "model": model,
        "baseline": BASELINE,
        "load_average": load,
        "machine": describe_machine(),
    }
    if not args.json:
        for name, measured in results.items():
            print(f"\n{name} ({measured['rows']} rows)\n")
            print(
                markdown_table(
                    ["arm", "rows/s (median)", f"× {BASELINE}", "seconds per round", "cosine"],
                    [
                        [
                            arm,
                            f"{measured['rows_per_s'][arm]:.0f}",
                            f"{measured[f'vs_{BASELINE}'][arm]:.2f}×",
                            ", ".join(f"{s:.1f}" for s in measured["seconds"][arm]),
                            "{mean:.4f} / {min:.4f}".format(
                                **measured[f"cosine_to_{BASELINE}"][arm]
                            ),
                        ]
                        for arm in arms
                    ],
                    right_aligned="-rr--",
                )
            )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
