"""Streaming corpora at scale: time to the first training batch and memory from 1M to 20M
sentences, and the streaming path's delivery rate against the in-memory path it replaced.

    python -m bench.corpus_scale --sizes 1000000 5000000 20000000 --workdir /tmp/corpus_scale

For each size, generated Parquet shards (1M sentences each: the shipped Wikipedia sentences,
numbered so that every row is distinct) are read the way a training run reads them: the driver
lists the files (data/stream.py `text_source`), the run's one feeder actor
(data/global_batches.py) reads and cleans them with Ray Data tasks and cuts global batches, and
rank 0 of 2 (played by this process) takes its slice of the first one. Each size runs in a
fresh process (its own Ray), so the peak RSS (VmHWM) of the driver and of the feeder actor is
that size's alone.

Delivery rate (1M sentences, same process, interleaved): rows per second into one rank of 2
(BATCH rows a slice), both ranks consuming, from (a) the streaming path and (b) the in-memory
path the project used before: every row read on the driver into one Arrow table, then
`ray.data.from_arrow`, its blocks served by the same feeder (data/stream.py `BlockSource`, what
a Tune search uses).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from distributed_emb.tables import markdown_table

SHARD_ROWS = 1_000_000
BATCH = 32


def peak_rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def write_shards(directory: Path, rows: int, shard_rows: int = SHARD_ROWS) -> Path:
    """Parquet shards of distinct sentences (cached: reused when already there)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from distributed_emb.paths import shipped_corpus

    target = directory / (f"{rows}" if shard_rows == SHARD_ROWS else f"{rows}_by_{shard_rows}")
    shards = -(-rows // shard_rows)
    if target.is_dir() and len(list(target.glob("*.parquet"))) == shards:
        return target
    target.mkdir(parents=True, exist_ok=True)
    base = pa.array(open(shipped_corpus("wiki_sentences.txt")).read().splitlines())
    for shard in range(shards):
        count = min(shard_rows, rows - shard * shard_rows)
        index = np.arange(shard * shard_rows, shard * shard_rows + count)
        texts = pc.binary_join_element_wise(
            base.take(pa.array(index % len(base))), pa.array(index.astype(str)), " #"
        )
        pq.write_table(pa.table({"text": texts}), target / f"part-{shard:05d}.parquet")
    return target


def _start_ray():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False


def _feeder(source, world: int):
    """A feeder actor as a run starts it (data/global_batches.py RankStream.connect), with
    `world` ranks of BATCH rows each."""
    import ray

    from distributed_emb.data.global_batches import IN_FLIGHT, BatchPlan, GlobalBatchFeeder

    class MeasuredFeeder(GlobalBatchFeeder):
        def peak_rss_mb(self) -> float:  # the feeder process's own
            return peak_rss_mb()

    plan = BatchPlan(global_batch=world * BATCH, seed=0)
    return (
        ray.remote(MeasuredFeeder)
        .options(num_cpus=0, max_concurrency=IN_FLIGHT * world + 4)
        .remote(source, plan, world)
    )


def _ranks(feeder, world: int):
    """The ranks' slices of each global batch, in lock step: [(table, position)] per batch."""
    from distributed_emb.data.epoch_order import DataPosition
    from distributed_emb.data.global_batches import RankStream

    ranks = [RankStream(feeder, rank).epoch(DataPosition()) for rank in range(world)]
    while True:
        slices = [next(rank, None) for rank in ranks]
        if None in slices:
            return
        yield slices


def _text_source(path: str, **data):
    from distributed_emb.data.corpus import start_drop_counter
    from distributed_emb.data.data_config import DataConfig
    from distributed_emb.data.stream import text_source

    counter = start_drop_counter()
    return text_source(DataConfig(path=path, **data), counter), counter


def first_batch(path: str) -> dict:
    """In this (fresh) process: seconds from listing the corpus to rank 0's first slice (the
    feeder's start included), and the peak RSS of the driver and of the feeder."""
    import ray

    _start_ray()
    started = time.perf_counter()
    source, _ = _text_source(path)
    feeder = _feeder(source, 2)
    (table, _), _ = next(_ranks(feeder, 2))
    seconds = time.perf_counter() - started
    assert table.num_rows == BATCH
    feeder_rss = ray.get(feeder.peak_rss_mb.remote())
    ray.kill(feeder)
    return {
        "first_batch_s": round(seconds, 2),
        "driver_peak_rss_mb": round(peak_rss_mb(), 1),
        "feeder_peak_rss_mb": round(feeder_rss, 1),
    }


def _rate(source, batches: int) -> float:
    """Rows/s into rank 0 of 2 over `batches` slices, after the first (start-up excluded: the
    rate of the steady stream)."""
    import ray

    feeder = _feeder(source, 2)
    stream = _ranks(feeder, 2)
    next(stream)
    started = time.perf_counter()
    for _ in range(batches):
        next(stream)
    rate = batches * BATCH / (time.perf_counter() - started)
    stream.close()
    ray.kill(feeder)  # stops its pipeline before the next measurement starts
    return rate


def delivery(path: str, batches: int, rounds: int) -> dict:
    import pyarrow as pa
    import ray

    from distributed_emb.data.corpus import read_rows
    from distributed_emb.data.readers import ROW_ID
    from distributed_emb.data.stream import BlockSource

    _start_ray()
    started = time.perf_counter()
    rows, _ = read_rows(path)  # the old path: every row through the driver
    table = pa.table({"text": rows["text"]})
    table = table.append_column(ROW_ID, pa.array(range(table.num_rows), pa.int64()))
    in_memory = BlockSource.of(ray.data.from_arrow(table).repartition(64).materialize())
    driver_read_s = time.perf_counter() - started
    streaming, memory = [], []
    for _ in range(rounds):  # interleaved: drift in machine speed hits both alike
        streaming.append(_rate(_text_source(path)[0], batches))
        memory.append(_rate(in_memory, batches))
    return {
        "streaming_rows_per_s": [round(r) for r in streaming],
        "in_memory_rows_per_s": [round(r) for r in memory],
        "ratio": round(sum(streaming) / sum(memory), 3),
        "in_memory_driver_read_s": round(driver_read_s, 1),
    }


def dedup_cost(path: str) -> dict:
    """Seconds for one full pass without and with `data.deduplicate`: the pass
    data/stream.py's `count_rows` makes (the stream's pipeline without its stages, `count()`)."""
    from distributed_emb.data.corpus import collect_report
    from distributed_emb.data.epoch_order import DataPosition, EpochOrder

    _start_ray()
    result = {}
    for dedup in (False, True):
        started = time.perf_counter()
        source, counter = _text_source(path, deduplicate=dedup)
        rows = source.dataset(EpochOrder(None, 0), DataPosition()).count()
        result["dedup" if dedup else "plain"] = {
            "pass_s": round(time.perf_counter() - started, 1),
            "rows": rows,
            "duplicates": collect_report(counter).dropped.get("duplicate", 0),
        }
    result["ratio"] = round(result["dedup"]["pass_s"] / result["plain"]["pass_s"], 2)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 5_000_000, 20_000_000])
    parser.add_argument("--workdir", default="/tmp/distributed_emb_corpus_scale")
    parser.add_argument("--batches", type=int, default=300, help="batches timed per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dedup", action="store_true", help="also time a pass with dedup on")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:  # one measurement in a fresh process
        kind, path = args.child
        measure = {"first": first_batch, "dedup": dedup_cost}.get(kind)
        result = measure(path) if measure else delivery(path, args.batches, args.rounds)
        print(json.dumps(result))
        return 0

    def child(kind: str, path: Path) -> dict:
        command = [sys.executable, __file__, "--child", kind, str(path)]
        command += ["--batches", str(args.batches), "--rounds", str(args.rounds)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])

    workdir = Path(args.workdir)
    rows = []
    for size in args.sizes:
        result = child("first", write_shards(workdir, size))
        rows.append(
            [
                f"{size:,}",
                str(-(-size // SHARD_ROWS)),
                str(result["first_batch_s"]),
                str(result["driver_peak_rss_mb"]),
                str(result["feeder_peak_rss_mb"]),
            ]
        )
    columns = [
        "sentences",
        "shards",
        "first batch (s)",
        "driver peak RSS (MiB)",
        "feeder peak RSS (MiB)",
    ]
    print(markdown_table(columns, rows, right_aligned="rrrrr"))
    if args.dedup:
        for size in args.sizes:
            result = child("dedup", write_shards(workdir, size))
            print(f"dedup, {size:,} sentences: {json.dumps(result)}")
        return 0
    result = child("delivery", write_shards(workdir, min(args.sizes)))
    print(f"\ndelivery into one rank of 2, {min(args.sizes):,} sentences: {json.dumps(result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
