"""Corpora at scale on the one data path: the token shards' build, the time to the first
training batch and the driver's memory from 1M to 20M sentences, and the delivery rate from
the shards.

    python -m bench.corpus_scale --sizes 1000000 5000000 20000000 --workdir /tmp/corpus_scale

For each size, generated Parquet shards (1M sentences each: the shipped Wikipedia sentences,
numbered so that every row is distinct) are read the way a training run reads them: the driver
lists the files and runs the one pass every corpus takes (data/token_cache.py: Ray Data read,
clean, tokenise, write the indexed shards; `--model`'s tokenizer, default the packaged MiniLM),
then rank 0 of 2 (played by this process, data/rank_batches.py) reads its slice of the first
global batch. Each size runs in a fresh process (its own Ray), so the driver's peak RSS
(VmHWM) is that size's alone. The build reads and tokenises the whole corpus, so its time
grows with it; the first slice after it, and the driver's memory, should not.

Delivery rate (the smallest size, same process, `--rounds` rounds): rows per second into rank
0 of 2 (BATCH rows a slice), both ranks consuming, read from the shards.

`--dedup`: seconds for one full pass of the corpus read without and with `data.deduplicate`
(data/corpus_dataset.py `training_dataset`, `count()`), the read the build makes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
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


def _config(path: str, model: str | None, *overrides: str):
    from distributed_emb.config import TrainingConfig, load_config
    from distributed_emb.paths import default_model_path

    return load_config(
        TrainingConfig,
        None,
        [
            f"model.path={model or default_model_path()}",
            f"data.path={path}",
            f"data.token_cache_dir={tempfile.mkdtemp(prefix='corpus_scale_cache_')}",
            *overrides,
        ],
    )


def _ranks(source, world: int):
    """The ranks' slices of each global batch, in lock step: [(table, position)] per batch."""
    from distributed_emb.data.epoch_plan import BatchPlan, DataPosition
    from distributed_emb.data.rank_batches import RankBatches

    plan = BatchPlan(global_batch=world * BATCH, seed=0)
    ranks = [RankBatches(source, plan, rank, world).epoch(DataPosition()) for rank in range(world)]
    while True:
        slices = [next(rank, None) for rank in ranks]
        if None in slices:
            return
        yield slices


def first_batch(path: str, model: str | None) -> dict:
    """In this (fresh) process: seconds to build the shards (listing included) and from then
    to rank 0's first slice, and the driver's peak RSS."""
    from distributed_emb.data.rank_batches import IndexedSource
    from distributed_emb.data.token_cache import token_shards

    _start_ray()
    config = _config(path, model)
    started = time.perf_counter()
    shards = token_shards(config.data, config.stream_settings())
    built = time.perf_counter()
    (table, _), _ = next(_ranks(IndexedSource(shards.index), 2))
    assert table.num_rows == BATCH
    return {
        "build_s": round(built - started, 2),
        "first_slice_s": round(time.perf_counter() - built, 3),
        "driver_peak_rss_mb": round(peak_rss_mb(), 1),
    }


def delivery(path: str, model: str | None, batches: int, rounds: int) -> dict:
    """Rows/s into rank 0 of 2 over `batches` slices after the first (start-up excluded)."""
    from distributed_emb.data.rank_batches import IndexedSource
    from distributed_emb.data.token_cache import token_shards

    _start_ray()
    config = _config(path, model)
    source = IndexedSource(token_shards(config.data, config.stream_settings()).index)
    rates = []
    for _ in range(rounds):
        stream = _ranks(source, 2)
        next(stream)
        started = time.perf_counter()
        for _ in range(batches):
            next(stream)
        rates.append(batches * BATCH / (time.perf_counter() - started))
        stream.close()
    return {"from_shards_rows_per_s": [round(r) for r in rates]}


def dedup_cost(path: str, model: str | None) -> dict:
    """Seconds for one full pass of the corpus read (data/corpus_dataset.py, the build's read)
    without and with `data.deduplicate`."""
    from distributed_emb.data.corpus import collect_report, start_drop_counter
    from distributed_emb.data.corpus_dataset import training_dataset

    _start_ray()
    result = {}
    for dedup in (False, True):
        config = _config(path, model, f"data.deduplicate={str(dedup).lower()}")
        started = time.perf_counter()
        counter = start_drop_counter()
        rows = training_dataset(config.data, counter).count()
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
    parser.add_argument("--model", default=None, help="tokenizer (default: packaged MiniLM)")
    parser.add_argument("--batches", type=int, default=300, help="batches timed per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dedup", action="store_true", help="also time a pass with dedup on")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:  # one measurement in a fresh process
        kind, path = args.child
        if kind == "first":
            result = first_batch(path, args.model)
        elif kind == "dedup":
            result = dedup_cost(path, args.model)
        else:
            result = delivery(path, args.model, args.batches, args.rounds)
        print(json.dumps(result))
        return 0

    def child(kind: str, path: Path) -> dict:
        command = [sys.executable, __file__, "--child", kind, str(path)]
        command += ["--batches", str(args.batches), "--rounds", str(args.rounds)]
        command += ["--model", args.model] if args.model else []
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
                str(result["build_s"]),
                str(result["first_slice_s"]),
                str(result["driver_peak_rss_mb"]),
            ]
        )
    columns = [
        "sentences",
        "files",
        "build (s)",
        "first slice after it (s)",
        "driver peak RSS (MiB)",
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
