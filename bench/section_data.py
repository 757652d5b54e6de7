"""Section 4: the data path alone, how fast the project reads, cleans and tokenises sentences,
set against how fast training consumes them; and, on its own, the delivery rate of the
tokenising data path (`python -m bench.section_data --json`, at the end of this file).

Table 4's three stages, each timed on its own:
- read + clean: one pass over the corpus as data/stream.py's `count_rows` makes it (Ray Data
  read and clean tasks: UTF-8 checks, empty rows dropped and counted; `count()`);
- feeder → worker batches: the run's one feeder actor (data/global_batches.py) cutting global
  batches of `batch_size` rows for one rank, which turns its slices into the collator's input
  (`numpy_batch`) and collates them (tokenisation into two views, dynamic padding), consumed as
  fast as they come (the first batch, which waits for the pipeline to start, timed apart);
- tokenise only: the same collator on in-memory lists, no Ray (the floor of the stage above).
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
    read_s: float  # read + clean: one counting pass
    first_batch_s: float  # feeder and Ray Data start-up: latency of the first batch
    iterate_sentences_per_s: float  # feeder → one rank's slices + collate
    tokenise_sentences_per_s: float  # collator only, no Ray


def _feeder(source, plan, world: int = 1):
    """A feeder actor as a run starts it (RankStream.connect), for `world` ranks."""
    import ray

    from distributed_emb.data.global_batches import IN_FLIGHT, GlobalBatchFeeder

    return (
        ray.remote(GlobalBatchFeeder)
        .options(num_cpus=0, max_concurrency=IN_FLIGHT * world + 4)
        .remote(source, plan, world)
    )


def time_data_path(
    model_path: str,
    batch_size: int,
    max_seq_length: int,
    max_batches: int,
    data_overrides: list[str] = (),
) -> DataPathTiming:
    import ray
    from transformers import AutoTokenizer

    from distributed_emb.config import load_config
    from distributed_emb.data.collate import ContrastiveCollator
    from distributed_emb.data.corpus import start_drop_counter
    from distributed_emb.data.data_config import DataConfig
    from distributed_emb.data.epoch_order import DataPosition, EpochOrder
    from distributed_emb.data.epoch_stream import numpy_batch
    from distributed_emb.data.global_batches import BatchPlan, RankStream
    from distributed_emb.data.stream import text_source

    data_config = load_config(DataConfig, None, list(data_overrides))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    collate = ContrastiveCollator(tokenizer, max_seq_length)

    started = time.perf_counter()
    source = text_source(data_config, start_drop_counter())
    dataset = source.dataset(EpochOrder(None, 0), DataPosition())  # count_rows's pass
    if data_config.max_rows is not None:
        dataset = dataset.limit(data_config.max_rows)
    rows = dataset.count()
    read_s = time.perf_counter() - started

    # The first batch pays the feeder's and the pipeline's start-up (once per epoch, hidden
    # behind the first window in training): timed on its own; throughput is over the batches
    # after it. One rank: its slice is the whole global batch.
    plan = BatchPlan(batch_size, data_config.shuffle_seed, max_rows=data_config.max_rows)
    feeder = _feeder(source, plan)
    tables = []
    sentences = 0
    started = time.perf_counter()
    for index, (table, _) in enumerate(RankStream(feeder, 0).epoch(DataPosition())):
        tables.append(table)
        batch = collate(numpy_batch(table))
        if index == 0:
            first_batch_s = time.perf_counter() - started
            started = time.perf_counter()
            continue
        sentences += batch["input_ids"].shape[0] // 2
        if index >= max_batches:
            break
    iterate = sentences / (time.perf_counter() - started)
    ray.kill(feeder)

    texts = [text for table in tables for text in table.column("text").to_pylist()]
    started = time.perf_counter()
    for start in range(0, len(texts) - batch_size + 1, batch_size):
        collate({"text": np.array(texts[start : start + batch_size], dtype=object)})
    tokenise = (len(texts) // batch_size * batch_size) / (time.perf_counter() - started)
    return DataPathTiming(rows, read_s, first_batch_s, iterate, tokenise)


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

    read_rate = timing.rows / timing.read_s
    table.add(
        f"read + clean corpus ({timing.rows:,} rows, Ray Data tasks)",
        read_rate,
        headroom(read_rate),
        "–",
    )
    table.add(
        "feeder slices + collate (1 rank)",
        timing.iterate_sentences_per_s,
        headroom(timing.iterate_sentences_per_s),
        "–",
    )
    table.add(
        "collate only (tokenise 2 views, no Ray)",
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
        f"The Ray Data pipeline's first batch came after {timing.first_batch_s:.2f} s "
        "(start-up, paid once per epoch inside the first window). "
        "Worker data wait = share of the training windows' wall time spent in "
        "`next(batches)` (the loop's data_wait_s / window_s): the time compute sat idle "
        "waiting for the data path. Read + clean runs once per run on the driver."
    )


# ---------------------------------------------------------------------------------------------
# Delivery into one consumer: tokenising in Ray Data, and from tokenised shards
#
#     python -m bench.section_data --json [--corpus DIR_OF_PARQUET] [--data-cpus 1 2]
#
# A Train worker's view of the stream (rank 0 of 1: the run's feeder actor and the rank's
# RankStream, data/global_batches.py), each setting in a fresh process with its own Ray of
# `data_cpus` CPUs:
# - delivered_per_s: text → the tokenising stage (data/tokenize.py) → the feeder's global
#   batches → the rank's slices and the collator's padding. Every row is tokenised while it is
#   delivered.
# - cache_build_per_s: the token cache's one pass (data/token_cache.py: read, clean, tokenise,
#   write Parquet) over `--cache-rows` rows, nothing consuming.
# - delivered_from_cache_per_s: the same consumer reading those tokenised shards: what later
#   epochs, resumed runs and Tune trials get. No tokenising happens in it.
# Against them: the collator tokenising in-memory text on one thread (what the worker's one
# iterator thread could deliver when the worker tokenises).
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
    batch) through the product's worker side (data/rank_batches.py: the feeder for streamed
    text, the rank's own reads for indexed shards), as the collator's input (`numpy_batch`),
    collated (padding only)."""
    from distributed_emb.data.epoch_order import DataPosition
    from distributed_emb.data.epoch_stream import numpy_batch
    from distributed_emb.data.global_batches import BatchPlan, RankStream
    from distributed_emb.data.rank_batches import IndexedSource, RankBatches

    plan = BatchPlan(batch_size, seed=0)
    feeder = None
    if isinstance(source, IndexedSource):
        stream = RankBatches(source, plan, 0, 1).epoch(DataPosition())
    else:
        feeder = _feeder(source, plan)
        stream = RankStream(feeder, 0).epoch(DataPosition())
    for _ in range(5):  # start-up excluded: the steady rate
        collate(numpy_batch(next(stream)[0]))
    started = time.perf_counter()
    for _ in range(batches):
        collate(numpy_batch(next(stream)[0]))
    rate = batches * batch_size / (time.perf_counter() - started)
    stream.close()
    if feeder is not None:
        import ray

        ray.kill(feeder)  # stops this pipeline's tasks before the next measurement starts
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
    from distributed_emb.data.corpus import start_drop_counter
    from distributed_emb.data.rank_batches import IndexedSource
    from distributed_emb.data.stream import text_source
    from distributed_emb.data.token_cache import token_shards
    from distributed_emb.data.tokenize import tokenize_arguments

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
            "data.token_cache=on",
            f"data.token_cache_dir={cache_dir}",
        ],
    )
    collate = ContrastiveCollator(AutoTokenizer.from_pretrained(model_path), max_len)

    # The baseline is timed right before and after each delivery, in this process: a shared
    # machine's load changes by the minute, so only rates timed together make a ratio.
    def one_thread() -> float:
        return collate_one_thread_per_s(path, model_path, batches * batch_size, batch_size, max_len)

    stage = tokenize_arguments(config.data, config.stream_settings())
    text = text_source(config.data, start_drop_counter(), [stage])
    before = one_thread()
    delivered = _consumed_per_s(text, collate, batch_size, batches)
    after = one_thread()

    config.data.max_rows = cache_rows
    started = time.perf_counter()
    shards = token_shards(config.data, config.stream_settings())
    build = shards.rows / (time.perf_counter() - started)
    cached = _consumed_per_s(IndexedSource(shards.index), collate, batch_size, batches)
    last = one_thread()
    return {
        "delivered": delivered,
        "one_thread": (before + after) / 2,
        "cache_build": build,
        "from_cache": cached,
        "one_thread_with_cache": (after + last) / 2,
    }


def main(argv=None) -> int:
    import argparse
    import json
    import os
    import subprocess
    import sys

    parser = argparse.ArgumentParser(description="delivery rate of the tokenising data path")
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
    one_thread = top["one_thread"]
    result = {
        # Tokenising while delivering: the rate a first epoch (or an uncached run) gets.
        "delivered_per_s": round(top["delivered"]),
        "collate_one_thread_per_s": round(one_thread),
        "data_cpus": every_cpu,
        "delivered_by_data_cpus": {str(k): round(v["delivered"]) for k, v in rates.items()},
        "ratio": round(top["delivered"] / one_thread, 2),
        "ratio_by_data_cpus": {
            str(k): round(v["delivered"] / v["one_thread"], 2) for k, v in rates.items()
        },
        # The token cache: its one tokenising pass, then reading what it wrote (no tokenising).
        "cache_build_per_s": round(top["cache_build"]),
        "cache_build_by_data_cpus": {str(k): round(v["cache_build"]) for k, v in rates.items()},
        "delivered_from_cache_per_s": round(top["from_cache"]),
        "from_cache_ratio": round(top["from_cache"] / top["one_thread_with_cache"], 2),
        "load_average_1min": round(os.getloadavg()[0], 1),  # other work on the machine
    }
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
