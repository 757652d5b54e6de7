"""The one data stream at scale: what W ranks cost the data path, and what a resume costs.

    python -m bench.data_scaling --json [--quick] [--workdir /tmp/distributed_emb_data_scaling]

Ranks (one corpus of generated Parquet shards, every row distinct and clean: 1M sentences in 8
shards, `--quick` 50k): for W = 1, 2, 4, one epoch through the product's path (text_source →
Ray Data read + clean tasks → one GlobalBatchFeeder actor → W RankStreams), the ranks played by
this process, one thread each, as W Train workers would consume their slices. Reported:
- rows_read_per_row: rows the cleaning tasks saw (DropCounter.rows_read, re-reads included) per
  row delivered to the ranks. 1.0: each row read once per epoch whatever W (the corpus is a
  whole number of global batches, so every row is delivered);
- delivered_per_s: rows delivered to all ranks together per second, for the whole epoch (the
  pipeline's start-up included; the feeder actor's own start, once per run, is not).
W values run interleaved (after one untimed warm-up), `--rounds` times (3, `--quick` 1); the
medians are reported.

Resume (21M sentences in 100k-row shards, `--quick` 25k in 1k-row shards: after the
position, as at the start, many files remain, so the resumed and the fresh stream read with
the same parallelism and the ratio measures what resuming costs): the checkpoint of a
run 1M and 20M rows into an epoch (`--quick`: 1k and 20k). The position is the real one: the
single-process reference (global_batches over local_epoch_tables, exactly what the feeder runs)
is run over the shard that ends at that row, from its start (a global batch boundary: the
global batch divides the shard size and every row is clean), and its last position is what the
run's checkpoint would hold. Reported:
- state_bytes: that position as trainer_state.json stores it (`json.dumps(position.as_dict())`);
- delivered_vs_fresh: rows/s over the first `--resume-rows` rows (200k, `--quick` 5k) of a
  fresh feeder whose stream starts at that position, pipeline start-up included, against the
  same from the start of the epoch (DataPosition(epoch=0)); one rank; median of `--rounds`
  interleaved pairs. The resumed stream's first global batch is checked against the reference.

Prints a markdown table; `--json` prints exactly one JSON line instead, shaped
{"ranks": {"1": {"rows_read_per_row", "delivered_per_s"}, "2": ..., "4": ...},
 "resume": {"<rows>": {"state_bytes", "delivered_vs_fresh"}, ...}}.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import threading
import time
from pathlib import Path

from bench.corpus_scale import write_shards
from distributed_emb.tables import markdown_table

WORLDS = (1, 2, 4)
FULL = {
    "rows": 1_000_000,
    "shards": 8,
    "resume_at": [1_000_000, 20_000_000],
    "resume_shard_rows": 100_000,
    "resume_corpus_rows": 21_000_000,
    "resume_rows": 200_000,
}
QUICK = {
    "rows": 16_000,
    "shards": 8,
    "resume_at": [1_000, 20_000],
    "resume_shard_rows": 1_000,
    "resume_corpus_rows": 25_000,
    "resume_rows": 5_000,
}


def _start_ray(cpus: int) -> None:
    import ray

    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False


def _source(path: Path, counter, block_rows: int):
    from distributed_emb.config import DataConfig
    from distributed_emb.data.stream import text_source

    return text_source(DataConfig(path=str(path), block_rows=block_rows), counter)


def deliver(source, plan, world: int, start, max_rows: int | None = None) -> dict:
    """One fresh feeder, `world` ranks consuming in threads from `start` until the epoch ends
    (or `max_rows` rows, all ranks together). Timed from the first request (the actor is
    started and ready before): {"rows", "seconds", "checksum", "first_ids"}."""
    import numpy as np
    import ray

    from distributed_emb.data.global_batches import IN_FLIGHT, GlobalBatchFeeder, RankStream
    from distributed_emb.data.readers import ROW_ID

    feeder = (
        ray.remote(GlobalBatchFeeder)
        .options(num_cpus=0, max_concurrency=IN_FLIGHT * world + 4)
        .remote(source, plan, world)
    )
    ray.get(feeder.__ray_ready__.remote())
    per_rank = None if max_rows is None else -(-max_rows // world)
    rows = [0] * world
    sums = [0] * world
    first: list = [None] * world
    errors: list[BaseException] = []

    def consume(rank: int) -> None:
        try:
            for table, _ in RankStream(feeder, rank).epoch(start):
                ids = table.column(ROW_ID).to_numpy()
                if first[rank] is None:
                    first[rank] = ids
                # A checksum of the rows delivered (the sum wraps at 2**64).
                sums[rank] = (sums[rank] + int(ids.astype(np.uint64).sum())) % 2**64
                rows[rank] += table.num_rows
                if per_rank is not None and rows[rank] >= per_rank:
                    return
        except BaseException as error:  # re-raised in the caller
            errors.append(error)

    threads = [threading.Thread(target=consume, args=(r,), daemon=True) for r in range(world)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    ray.kill(feeder)  # stops its stream (and the Ray Data pipeline inside it) if cut short
    if errors:
        raise errors[0]
    if len(set(rows)) != 1:
        raise RuntimeError(f"ranks got different numbers of rows: {rows}")
    return {
        "rows": sum(rows),
        "seconds": seconds,
        "checksum": sum(sums) % 2**64,
        "first_ids": None if first[0] is None else np.concatenate(first).tolist(),
    }


def rank_scaling(path: Path, corpus_rows: int, global_batch: int, block_rows: int,
                 rounds: int) -> dict:  # fmt: skip
    """{W: {"rows_read_per_row", "delivered_per_s"}}: medians over `rounds` interleaved runs of
    a whole epoch (see the module docstring)."""
    import ray

    from distributed_emb.data.corpus import start_drop_counter
    from distributed_emb.data.epoch_order import DataPosition
    from distributed_emb.data.global_batches import BatchPlan

    plan = BatchPlan(global_batch=global_batch, seed=0)
    # Untimed: the first pipeline of a fresh Ray starts its worker processes.
    warm_up = _source(path, start_drop_counter(), block_rows)
    deliver(warm_up, plan, 1, DataPosition(), 8 * global_batch)
    runs: dict[int, list[dict]] = {w: [] for w in WORLDS}
    checksums = set()
    for round_ in range(rounds):
        # The order rotates each round: drift in the machine's speed hits every W alike.
        for world in WORLDS[round_ % len(WORLDS) :] + WORLDS[: round_ % len(WORLDS)]:
            counter = start_drop_counter()
            result = deliver(_source(path, counter, block_rows), plan, world, DataPosition())
            read = ray.get(counter.rows_read.remote())
            ray.kill(counter)
            if result["rows"] != corpus_rows:
                raise RuntimeError(f"W={world}: {result['rows']} rows delivered, not {corpus_rows}")
            checksums.add(result["checksum"])
            runs[world].append(
                {"read_per_row": read / result["rows"], "per_s": result["rows"] / result["seconds"]}
            )
    if len(checksums) != 1:
        raise RuntimeError("the ranks' rows differ between worker counts")
    return {
        str(world): {
            "rows_read_per_row": round(
                statistics.median(r["read_per_row"] for r in runs[world]), 6
            ),
            "delivered_per_s": round(statistics.median(r["per_s"] for r in runs[world])),
        }
        for world in WORLDS
    }


def checkpoint_position(source, plan, rows: int, shard_rows: int):
    """The position a run's checkpoint holds after the global batch that ends `rows` rows into
    epoch 0 (a whole number of shards): the reference over the shard that ends there, from its
    start."""
    from distributed_emb.data.epoch_order import DataPosition, EpochOrder, block_key
    from distributed_emb.data.global_batches import global_batches
    from distributed_emb.data.stream import local_epoch_tables

    shards, rest = divmod(rows, shard_rows)
    if rest or shard_rows % plan.global_batch or shards < 1:
        raise ValueError(f"{rows} rows is not a whole number of {shard_rows}-row shards, or "
                         f"{plan.global_batch} does not divide the shard")  # fmt: skip
    start = DataPosition(0, block_key(shards - 1, 0), 0, (shards - 1) * shard_rows)
    unit_key = block_key(shards, 0)
    position = start
    for _, position in global_batches(
        local_epoch_tables(source, EpochOrder(plan.seed, 0), start), plan, start
    ):
        if position.block >= unit_key or position.rows >= rows:
            break  # the next shard: not needed
    if position.rows != rows:
        raise RuntimeError(f"the shard ended at {position.rows} rows, not {rows}")
    return position


def reference_first_ids(source, plan, start) -> list[int]:
    from distributed_emb.data.epoch_order import EpochOrder
    from distributed_emb.data.global_batches import global_batches
    from distributed_emb.data.readers import ROW_ID
    from distributed_emb.data.stream import local_epoch_tables

    tables = local_epoch_tables(source, EpochOrder(plan.seed, start.epoch), start)
    batch, _ = next(global_batches(tables, plan, start))
    return batch.column(ROW_ID).to_pylist()


def resume_cost(path: Path, positions: list[int], shard_rows: int, global_batch: int,
                block_rows: int, measured_rows: int, rounds: int) -> dict:  # fmt: skip
    """{rows into the epoch: {"state_bytes", "delivered_vs_fresh", ...}} (module docstring)."""
    from distributed_emb.data.corpus import start_drop_counter
    from distributed_emb.data.epoch_order import DataPosition
    from distributed_emb.data.global_batches import BatchPlan

    plan = BatchPlan(global_batch=global_batch, seed=0)
    local = _source(path, None, block_rows)  # the reference reads in this process
    source = _source(path, start_drop_counter(), block_rows)
    fresh = DataPosition(epoch=0)
    result = {}
    for rows in positions:
        started = time.perf_counter()
        position = checkpoint_position(local, plan, rows, shard_rows)
        position_s = time.perf_counter() - started
        expected_first = reference_first_ids(local, plan, position)
        ratios, fresh_rates, resumed_rates = [], [], []
        for round_ in range(rounds):
            pair = {}
            for name in ("fresh", "resumed") if round_ % 2 == 0 else ("resumed", "fresh"):
                start = position if name == "resumed" else fresh
                pair[name] = deliver(source, plan, 1, start, measured_rows)
            if pair["resumed"]["first_ids"] != expected_first:
                raise RuntimeError(f"the stream resumed at {position} is not the reference's")
            fresh_rate = pair["fresh"]["rows"] / pair["fresh"]["seconds"]
            resumed_rate = pair["resumed"]["rows"] / pair["resumed"]["seconds"]
            fresh_rates.append(fresh_rate)
            resumed_rates.append(resumed_rate)
            ratios.append(resumed_rate / fresh_rate)
        result[str(rows)] = {
            "state_bytes": len(json.dumps(position.as_dict()).encode()),
            "delivered_vs_fresh": round(statistics.median(ratios), 3),
            # For the table only (not in --json): what the ratio is made of.
            "_position": position.as_dict(),
            "_position_s": position_s,
            "_fresh_per_s": statistics.median(fresh_rates),
            "_resumed_per_s": statistics.median(resumed_rates),
        }
    return result


def main(argv=None) -> int:
    import ray

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--quick", action="store_true", help="small corpora (seconds, for tests)")
    parser.add_argument("--workdir", default="/tmp/distributed_emb_data_scaling")
    parser.add_argument("--rounds", type=int, default=None, help="default: 3 (--quick: 1)")
    parser.add_argument("--global-batch", type=int, default=500, help="divides every shard; W | it")
    parser.add_argument("--block-rows", type=int, default=10_000, help="data.block_rows")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    workdir = Path(args.workdir)

    # --json: stdout is the JSON line alone (anything else printed goes to stderr).
    with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
        rank_corpus = write_shards(workdir, sizes["rows"], sizes["rows"] // sizes["shards"])
        resume_corpus = write_shards(
            workdir, sizes["resume_corpus_rows"], sizes["resume_shard_rows"]
        )
        _start_ray(args.cpus)
        started = time.perf_counter()
        ranks = rank_scaling(
            rank_corpus, sizes["rows"], args.global_batch, args.block_rows, args.rounds
        )
        ranks_s = time.perf_counter() - started
        started = time.perf_counter()
        resume = resume_cost(
            resume_corpus, sizes["resume_at"], sizes["resume_shard_rows"], args.global_batch,
            args.block_rows, sizes["resume_rows"], args.rounds,
        )  # fmt: skip
        resume_s = time.perf_counter() - started
        ray.shutdown()  # Ray's own late messages (a killed feeder's tasks) come before ours

    if args.json:
        public = {
            k: {n: v for n, v in r.items() if not n.startswith("_")} for k, r in resume.items()
        }
        print(json.dumps({"ranks": ranks, "resume": public}))
        return 0
    one = ranks["1"]["delivered_per_s"]
    print(f"Ranks: {sizes['rows']:,} rows in {sizes['shards']} shards, global batch "
          f"{args.global_batch}, median of {args.rounds} ({ranks_s:.0f} s)\n")  # fmt: skip
    rows = [
        [
            w,
            f"{r['rows_read_per_row']:.4f}",
            f"{r['delivered_per_s']:,}",
            f"{r['delivered_per_s'] / one:.2f}×",
        ]
        for w, r in ranks.items()
    ]
    columns = ["ranks (W)", "rows read per row delivered", "delivered rows/s (all ranks)", "× W=1"]
    print(markdown_table(columns, rows, right_aligned="rrrr"))
    print(f"\nResume: {sizes['resume_corpus_rows']:,} rows in {sizes['resume_shard_rows']:,}-row "
          f"shards, first {sizes['resume_rows']:,} rows after the start, 1 rank, median of "
          f"{args.rounds} ({resume_s:.0f} s)\n")  # fmt: skip
    rows = [
        [
            f"{int(n):,}",
            str(r["state_bytes"]),
            f"{r['_fresh_per_s']:,.0f}",
            f"{r['_resumed_per_s']:,.0f}",
            f"{r['delivered_vs_fresh']:.2f}×",
            json.dumps(r["_position"]),
        ]
        for n, r in resume.items()
    ]
    columns = ["rows into the epoch", "state bytes", "fresh rows/s", "resumed rows/s",
               "resumed × fresh", "position"]  # fmt: skip
    print(markdown_table(columns, rows, right_aligned="rrrrr-"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
