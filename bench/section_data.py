"""Section 4: the data path alone, how fast the project reads, cleans and tokenises sentences,
set against how fast training consumes them; and, on its own, the token shards' build and
delivery rates (`python -m bench.section_data --json`, at the end of this file).

Table 4's three stages, each timed on its own:
- build: the one pass every corpus takes before training (data/token_cache.py: Ray Data read,
  clean with drop counts, tokenise, write the indexed shards), timed from the call to the
  commit;
- shards → worker batches: one rank of 1 reading its slices of each global batch of
  `batch_size` rows from the shards (data/rank_batches.py), turning them into the collator's
  input (`numpy_batch`) and collating them (padding, two views), consumed as fast as they come
  (the first batch, which pays the reader's start, timed apart);
- tokenise only: the same collator tokenising the text in memory, no Ray (what a worker would
  pay per row without the shards).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from bench.context import BenchContext
    from bench.project_runs import ProjectRun


@dataclass
class DataPathTiming:
    rows: int
    build_s: float  # read + clean + tokenise + write the shards: the one pass
    first_batch_s: float  # the rank's reader start-up: latency of the first batch
    iterate_sentences_per_s: float  # shards → one rank's slices + collate
    tokenise_sentences_per_s: float  # collator tokenising text, no Ray


def time_data_path(
    model_path: str,
    batch_size: int,
    max_seq_length: int,
    max_batches: int,
    data_overrides: list[str] = (),
) -> DataPathTiming:
    import tempfile

    from transformers import AutoTokenizer

    from distributed_emb.config import TrainingConfig, load_config
    from distributed_emb.data.batches import numpy_batch
    from distributed_emb.data.collate import ContrastiveCollator
    from distributed_emb.data.corpus import corpus_path, read_rows
    from distributed_emb.data.epoch_plan import BatchPlan, DataPosition
    from distributed_emb.data.rank_batches import IndexedSource, RankBatches
    from distributed_emb.data.token_cache import token_shards

    config = load_config(
        TrainingConfig,
        None,
        [
            f"model.path={model_path}",
            f"model.max_seq_length={max_seq_length}",
            f"data.token_cache_dir={tempfile.mkdtemp(prefix='data_path_token_cache_')}",
            *(f"data.{override}" for override in data_overrides),
        ],
    )
    data_config = config.data
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    collate = ContrastiveCollator(tokenizer, max_seq_length)

    started = time.perf_counter()
    shards = token_shards(data_config, config.stream_settings())  # a fresh cache: built now
    build_s = time.perf_counter() - started

    # The first batch pays the reader's start (once per epoch): timed on its own; throughput
    # is over the batches after it. One rank: its slice is the whole global batch.
    plan = BatchPlan(batch_size, data_config.shuffle_seed)
    reader = RankBatches(IndexedSource(shards.index), plan, 0, 1)
    sentences = 0
    started = time.perf_counter()
    for index, (table, _) in enumerate(reader.epoch(DataPosition())):
        batch = collate(numpy_batch(table))
        if index == 0:
            first_batch_s = time.perf_counter() - started
            started = time.perf_counter()
            continue
        sentences += batch["input_ids"].shape[0] // 2
        if index >= max_batches:
            break
    iterate = sentences / (time.perf_counter() - started)

    rows, _ = read_rows(corpus_path(data_config), max_rows=max_batches * batch_size)
    texts = rows["text"]
    started = time.perf_counter()
    for start in range(0, len(texts) - batch_size + 1, batch_size):
        collate({"text": np.array(texts[start : start + batch_size], dtype=object)})
    tokenise = (len(texts) // batch_size * batch_size) / (time.perf_counter() - started)
    return DataPathTiming(shards.rows, build_s, first_batch_s, iterate, tokenise)


def run(
    bench: BenchContext,
    one_worker: list[ProjectRun] | None,
    two_workers: list[ProjectRun] | None,
) -> None:
    """Fills table 4. `one_worker` and `two_workers` are the project's Ray Train runs (1 worker;
    2 workers with the gather); None leaves their rows empty."""
    # Here, not at the top: the delivery benchmark's --child process runs this file as a
    # script, where `bench` is not importable.
    from bench.report import median, percent, ratio

    a = bench.args
    timing = time_data_path(
        bench.model, a.batch, a.seq, a.data_batches, ["max_rows=2000"] if a.tiny else []
    )
    bench.results["raw"]["data"] = vars(timing)
    consumption = median([r.sentences_per_s for r in one_worker]) if one_worker else None
    table = bench.table(
        "data_path",
        "4. Data path: reading and tokenising against training consumption",
        ["stage", "sentences/s", "× training consumption (1 worker)", "worker data wait"],
    )

    def headroom(rate):
        return ratio(rate / consumption) if consumption else "–"

    build_rate = timing.rows / timing.build_s
    table.add(
        f"build the token shards ({timing.rows:,} rows: read, clean, tokenise, write; Ray Data)",
        build_rate,
        headroom(build_rate),
        "–",
    )
    table.add(
        "shards → rank slices + collate (1 rank)",
        timing.iterate_sentences_per_s,
        headroom(timing.iterate_sentences_per_s),
        "–",
    )
    table.add(
        "collate tokenising text (2 views, no Ray)",
        timing.tokenise_sentences_per_s,
        headroom(timing.tokenise_sentences_per_s),
        "–",
    )
    if one_worker:
        table.add(
            "training consumption, 1 worker",
            consumption,
            ratio(1.0),
            percent(median([r.data_wait_fraction for r in one_worker])),
        )
    else:
        table.add("training consumption, 1 worker", None, "–", "–")
    if two_workers:
        table.add(
            "training consumption, 2 workers (global)",
            median([r.sentences_per_s for r in two_workers]),
            "–",
            percent(median([r.data_wait_fraction for r in two_workers])),
        )
    else:
        table.add("training consumption, 2 workers (global)", None, "–", "–")
    table.notes.append(
        f"The rank's first batch came after {timing.first_batch_s:.2f} s (its reader's "
        "start, paid once per epoch inside the first window). "
        "Worker data wait = share of the training windows' wall time spent in "
        "`next(batches)` (the loop's data_wait_s / window_s): the time compute sat idle "
        "waiting for the data path. The build runs once per corpus and tokenizer, before "
        "training, and later runs reuse it."
    )


# ---------------------------------------------------------------------------------------------
# The token shards: their build, and delivery from them into one consumer
#
#     python -m bench.section_data --json [--corpus DIR_OF_PARQUET] [--data-cpus 1 2]
#
# Each setting in a fresh process with its own Ray of `data_cpus` CPUs:
# - cache_build_per_s: the one pass every corpus takes (data/token_cache.py: read, clean,
#   tokenise, write the indexed shards) over `--cache-rows` rows, nothing consuming.
# - delivered_from_cache_per_s: a Train worker's view of the shards (rank 0 of 1,
#   data/rank_batches.py RankBatches): its slices, as the collator's input, padded. No
#   tokenising happens in it: the rate of every epoch.
# Against them: the collator tokenising in-memory text on one thread (what a worker's one
# iterator thread could deliver if it tokenised).
# ---------------------------------------------------------------------------------------------


def collate_one_thread_per_s(path: str, model_path: str, rows: int, batch_size: int, max_len: int):
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    from distributed_emb.data.collate import ContrastiveCollator
    from distributed_emb.data.sources import resolve_sources

    first = resolve_sources(path).files[0].path
    texts = pq.read_table(first, columns=["text"]).column("text").to_pylist()[:rows]
    collate = ContrastiveCollator(AutoTokenizer.from_pretrained(model_path), max_len)
    started = time.perf_counter()
    for start in range(0, len(texts) - batch_size + 1, batch_size):
        collate({"text": np.array(texts[start : start + batch_size], dtype=object)})
    return (len(texts) // batch_size * batch_size) / (time.perf_counter() - started)


def _consumed_per_s(source, collate, batch_size: int, batches: int) -> float:
    """Rows/s a worker's loop gets: its slices of the global batches (one rank: the whole
    batch) read by the product's worker side (data/rank_batches.py), as the collator's input
    (`numpy_batch`), collated (padding only)."""
    from distributed_emb.data.batches import numpy_batch
    from distributed_emb.data.epoch_plan import BatchPlan, DataPosition
    from distributed_emb.data.rank_batches import RankBatches

    stream = RankBatches(source, BatchPlan(batch_size, seed=0), 0, 1).epoch(DataPosition())
    for _ in range(5):  # start-up excluded: the steady rate
        collate(numpy_batch(next(stream)[0]))
    started = time.perf_counter()
    for _ in range(batches):
        collate(numpy_batch(next(stream)[0]))
    rate = batches * batch_size / (time.perf_counter() - started)
    stream.close()
    return rate


def delivery_rates(
    path: str,
    model_path: str,
    data_cpus: int,
    batches: int,
    batch_size: int,
    max_len: int,
    cache_rows: int,
) -> dict[str, float]:
    import tempfile

    import ray
    from transformers import AutoTokenizer

    from distributed_emb.config import TrainingConfig, load_config
    from distributed_emb.data.collate import ContrastiveCollator
    from distributed_emb.data.rank_batches import IndexedSource
    from distributed_emb.data.token_cache import token_shards

    ray.init(address="local", num_cpus=data_cpus, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    cache_dir = tempfile.mkdtemp(prefix="data_path_token_cache_")
    config = load_config(
        TrainingConfig,
        None,
        [
            f"model.path={model_path}",
            f"model.max_seq_length={max_len}",
            f"data.path={path}",
            f"data.max_rows={cache_rows}",
            f"data.token_cache_dir={cache_dir}",
        ],
    )
    collate = ContrastiveCollator(AutoTokenizer.from_pretrained(model_path), max_len)

    # The baseline is timed right before and after the delivery, in this process: a shared
    # machine's load changes by the minute, so only rates timed together make a ratio.
    def one_thread() -> float:
        return collate_one_thread_per_s(path, model_path, batches * batch_size, batch_size, max_len)

    started = time.perf_counter()
    shards = token_shards(config.data, config.stream_settings())
    build = shards.rows / (time.perf_counter() - started)
    before = one_thread()
    cached = _consumed_per_s(IndexedSource(shards.index), collate, batch_size, batches)
    after = one_thread()
    return {"cache_build": build, "from_cache": cached, "one_thread": (before + after) / 2}


def main(argv=None) -> int:
    import argparse
    import json
    import os
    import subprocess
    import sys

    parser = argparse.ArgumentParser(description="the token shards' build and delivery rates")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--corpus", default=None, help="Parquet corpus (default: 1M in 8 shards)")
    parser.add_argument("--model", default=None, help="tokenizer (default: packaged MiniLM)")
    parser.add_argument("--data-cpus", type=int, nargs="+", default=None)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-len", type=int, default=32)
    parser.add_argument(
        "--cache-rows", type=int, default=100_000, help="rows the cache build tokenises"
    )
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread means one thread
    from distributed_emb.paths import default_model_path

    model = args.model or default_model_path()
    if args.corpus is None:
        from bench.corpus_scale import write_shards

        args.corpus = str(
            write_shards(__import__("pathlib").Path("/tmp/distributed_emb_corpus_scale"), 1_000_000)
        )
    if args.child is not None:
        rates = delivery_rates(
            args.corpus, model, args.child, args.batches, args.batch_size, args.max_len,
            args.cache_rows,
        )  # fmt: skip
        print(json.dumps(rates))
        return 0
    cpus = args.data_cpus or sorted({1, os.cpu_count() or 1})
    rates = {}
    for n in cpus:
        command = [sys.executable, __file__, "--child", str(n), "--corpus", args.corpus]
        command += ["--model", model, "--batches", str(args.batches)]
        command += ["--batch-size", str(args.batch_size), "--max-len", str(args.max_len)]
        command += ["--cache-rows", str(args.cache_rows)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:  # the child's own error, not only its exit status
            raise SystemExit(f"data_cpus={n}: child failed:\n{done.stderr[-3000:]}")
        rates[n] = json.loads(done.stdout.strip().splitlines()[-1])
    every_cpu = max(cpus)
    top = rates[every_cpu]
    result = {
        # The one pass every corpus takes, then reading what it wrote (no tokenising).
        "cache_build_per_s": round(top["cache_build"]),
        "cache_build_by_data_cpus": {str(k): round(v["cache_build"]) for k, v in rates.items()},
        "data_cpus": every_cpu,
        "delivered_from_cache_per_s": round(top["from_cache"]),
        "collate_one_thread_per_s": round(top["one_thread"]),
        "from_cache_ratio": round(top["from_cache"] / top["one_thread"], 2),
        "load_average_1min": round(os.getloadavg()[0], 1),  # other work on the machine
    }
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
