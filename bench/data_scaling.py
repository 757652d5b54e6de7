"""The data path at scale: what W ranks reading their own rows cost, what a resume deep in a
shard costs, and how well the epoch's order shuffles.

    python -m bench.data_scaling --json [--quick] [--workdir /tmp/distributed_emb_data_scaling]

The corpus is indexed shards as the token cache writes them for every run (data/indexed_shards.py:
Arrow IPC files of `_row_id`, `text__ids` lists of 8–40 token ids, `_length`), generated once
under `--workdir`; this measures reading them, not the build that writes them
(bench/corpus_scale.py, bench/section_data.py).

Ranks (1M rows in 8 shards, `--quick` 16k): for W = 1, 2, 4, one epoch through the product's
worker side (data/rank_batches.py RankBatches: the order, this rank's slice of each global
batch of 1,024, a read from the memory-mapped shards, the reading thread), each rank a
separate process started before the clock, all released together. Reported:
- rows_read_per_row: rows the ranks' readers materialised per row delivered (1.0: each row
  read once, by the rank that trains it, whatever W);
- delivered_per_s: rows delivered to all ranks together per second, over the epoch;
- per_rank_per_s: delivered_per_s / W (reported, not targeted: on a 2-core machine the ranks
  share the same cores).
W values run interleaved, `--rounds` times (3, `--quick` 1); medians.

coordinator_row_bytes: bytes of row data through any process other than the rank that trains
the row, per row delivered: the bench's parent process and every rank's reader are counted
(each reader's rows_taken must equal its rows delivered); 0 means no process carried another's
rows. `row_bytes`: the mean row size of these shards, what a process handing rows to the ranks
would carry per row.

Resume (one shard of 10M rows, `--quick` 200k; the position half-way into it): the
checkpoint's state (the position and the stream identity, as trainer_state.json stores them)
and delivered_vs_fresh: rows/s over the first `--resume-rows` rows (200k, `--quick` 20k) from
that position against the same from the epoch's start, one rank, medians of `--rounds`
interleaved pairs. The resumed rows are checked against the order's reference.

Shuffle: bench/shuffle_quality.py's statistics for this product's order, MosaicML Streaming's
py1e and a uniform permutation, on the same shard sizes.

Prints a markdown table; `--json` prints exactly one JSON line:
{"ranks": {"1": {"rows_read_per_row", "delivered_per_s", "per_rank_per_s"}, "2": ..., "4": ...},
 "coordinator_row_bytes": ..., "row_bytes": ...,
 "resume": {"<rows>": {"state_bytes", "delivered_vs_fresh", "shard_rows", "offset_in_shard"}},
 "shuffle": {"ours": {...}, "py1e": {...}, "iid": {...}}}
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from distributed_emb.tables import markdown_table

WORLDS = (1, 2, 4)
GLOBAL_BATCH = 1024
FULL = {"rows": 1_000_000, "shards": 8, "resume_shard_rows": 10_000_000, "resume_rows": 200_000}
QUICK = {"rows": 16_000, "shards": 8, "resume_shard_rows": 200_000, "resume_rows": 20_000}
WRITE_ROWS = 500_000  # rows generated and written at a time


def write_corpus(directory: Path, rows: int, shards: int) -> None:
    """`shards` IPC shards of `rows` rows in all (once: kept under the workdir)."""
    import pyarrow as pa

    from distributed_emb.data.indexed_shards import LENGTH, write_shard
    from distributed_emb.data.readers import ROW_ID

    if (directory / "DONE").exists():
        return
    directory.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, rows, shards + 1).astype(np.int64)
    generator = np.random.default_rng(0)
    for shard in range(shards):
        parts = []
        for start in range(bounds[shard], bounds[shard + 1], WRITE_ROWS):
            stop = min(start + WRITE_ROWS, bounds[shard + 1])
            lengths = generator.integers(8, 41, stop - start).astype(np.int32)
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            values = generator.integers(100, 30_000, offsets[-1]).astype(np.int32)
            ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
            parts.append(
                pa.table(
                    {
                        ROW_ID: np.arange(start, stop, dtype=np.int64),
                        "text__ids": ids,
                        LENGTH: lengths,
                    }  # fmt: skip
                )
            )
        write_shard(pa.concat_tables(parts), str(directory / f"shard-{shard:05d}.arrow"))
    (directory / "DONE").write_text("")


def _rank(directory: str, plan, rank: int, world: int, start: dict, max_rows, ready, go, out):
    """One rank's process: set up, wait for the start, read its slices, report."""
    from distributed_emb.data.epoch_plan import DataPosition
    from distributed_emb.data.indexed_shards import ShardIndex
    from distributed_emb.data.rank_batches import IndexedSource, RankBatches
    from distributed_emb.data.readers import ROW_ID

    ranks = RankBatches(IndexedSource(ShardIndex.scan(directory)), plan, rank, world)
    ranks.source.order(plan.seed, 0).rows(0, 1)  # the span order: set-up, not reading
    ready.set()
    go.wait()
    started = time.perf_counter()
    rows, checksum, first = 0, 0, None
    for table, _ in ranks.epoch(DataPosition.from_dict(start)):
        ids = table.column(ROW_ID).to_numpy()
        first = ids[:16].tolist() if first is None else first
        checksum = (checksum + int(ids.astype(np.uint64).sum())) % 2**64
        rows += table.num_rows
        if max_rows is not None and rows >= max_rows:
            break
    out.put({"rank": rank, "rows": rows, "taken": ranks.reader.rows_taken,
             "seconds": time.perf_counter() - started, "checksum": checksum,
             "first": first})  # fmt: skip


def deliver(directory: Path, plan, world: int, start: dict | None = None, max_rows=None) -> dict:
    """W rank processes reading from `start` to the end of the epoch (or `max_rows` rows
    each): {"rows", "taken", "seconds", "checksum", "first"}; the clock runs from the common
    release to the last rank's end."""
    context = multiprocessing.get_context("spawn")
    ready = [context.Event() for _ in range(world)]
    go, out = context.Event(), context.Queue()
    processes = [
        context.Process(
            target=_rank,
            args=(str(directory), plan, r, world, start or {}, max_rows, ready[r], go, out),
        )
        for r in range(world)
    ]
    for process in processes:
        process.start()
    for event in ready:
        event.wait()
    go.set()
    results = sorted((out.get() for _ in range(world)), key=lambda r: r["rank"])
    for process in processes:
        process.join()
    if any(p.exitcode for p in processes):
        raise RuntimeError(f"a rank failed: {[p.exitcode for p in processes]}")
    return {
        "rows": sum(r["rows"] for r in results),
        "taken": sum(r["taken"] for r in results),
        "seconds": max(r["seconds"] for r in results),
        "checksum": sum(r["checksum"] for r in results) % 2**64,
        "first": results[0]["first"],
        "per_rank": results,
    }


def rank_scaling(directory: Path, corpus_rows: int, rounds: int) -> dict:
    from distributed_emb.data.epoch_plan import BatchPlan

    plan = BatchPlan(global_batch=GLOBAL_BATCH, seed=0)
    expected = corpus_rows // GLOBAL_BATCH * GLOBAL_BATCH
    runs: dict[int, list[dict]] = {w: [] for w in WORLDS}
    checksums = set()
    for round_ in range(rounds):
        # The order rotates each round: drift in the machine's speed hits every W alike.
        for world in WORLDS[round_ % len(WORLDS) :] + WORLDS[: round_ % len(WORLDS)]:
            result = deliver(directory, plan, world)
            if result["rows"] != expected:
                raise RuntimeError(f"W={world}: {result['rows']} rows delivered, not {expected}")
            checksums.add(result["checksum"])
            runs[world].append(result)
    if len(checksums) != 1:
        raise RuntimeError("the ranks' rows differ between worker counts")
    out = {}
    # Rows a rank's reader materialised beyond those it trained: another rank's rows in its
    # process (the parent process reads none).
    over_read = sum(max(0, r["taken"] - r["rows"]) for w in WORLDS for run in runs[w]
                    for r in run["per_rank"])  # fmt: skip
    delivered = sum(run["rows"] for w in WORLDS for run in runs[w])
    out["_over_read_per_row"] = over_read / delivered
    for world in WORLDS:
        per_s = statistics.median(r["rows"] / r["seconds"] for r in runs[world])
        out[str(world)] = {
            "rows_read_per_row": round(
                statistics.median(r["taken"] / r["rows"] for r in runs[world]), 6
            ),
            "delivered_per_s": round(per_s),
            "per_rank_per_s": round(per_s / world),
        }
    return out


def mean_row_bytes(directory: Path) -> float:
    """Bytes of row data per row in the shards."""
    import pyarrow as pa

    files = sorted(directory.glob("*.arrow"))
    table = pa.ipc.open_file(pa.memory_map(str(files[0]))).read_all()
    return table.nbytes / table.num_rows


def resume_cost(directory: Path, shard_rows: int, measured_rows: int, rounds: int) -> dict:
    from distributed_emb.data.epoch_plan import BatchPlan, DataPosition
    from distributed_emb.data.indexed_shards import ShardIndex
    from distributed_emb.data.rank_batches import IndexedSource
    from distributed_emb.data.training_stream import TrainingStream

    plan = BatchPlan(global_batch=GLOBAL_BATCH, seed=0)
    source = IndexedSource(ShardIndex.scan(str(directory)))
    offset = -(-shard_rows // 2 // GLOBAL_BATCH) * GLOBAL_BATCH  # the boundary past half
    position = DataPosition(0, rows=offset)
    # What a checkpoint keeps for the data: the position and the stream it indexes.
    stream = TrainingStream(source, source.index.rows).identity(plan)
    state = {"position": position.as_dict(), "stream": stream}
    # The resumed stream starts where the order says: its first rows are the reference's.
    expected = source.order(0, 0).rows(offset, offset + 16).tolist()
    ratios = []
    for round_ in range(rounds):
        pair = {}
        for name in ("fresh", "resumed") if round_ % 2 == 0 else ("resumed", "fresh"):
            start = position.as_dict() if name == "resumed" else None
            pair[name] = deliver(directory, plan, 1, start, measured_rows)
        if pair["resumed"]["first"] != expected:
            raise RuntimeError("the resumed stream is not the order's reference")
        rate = {k: v["rows"] / v["seconds"] for k, v in pair.items()}
        ratios.append(rate["resumed"] / rate["fresh"])
    return {
        str(offset): {
            "state_bytes": len(json.dumps(state).encode()),
            "delivered_vs_fresh": round(statistics.median(ratios), 3),
            "shard_rows": shard_rows,
            "offset_in_shard": offset,
        }
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="small corpora (a smoke test)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--workdir", default="/tmp/distributed_emb_data_scaling")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    rounds = args.rounds or (1 if args.quick else 3)
    workdir = Path(args.workdir) / ("quick" if args.quick else "full")

    from bench.shuffle_quality import measure as shuffle_statistics

    ranks_dir = workdir / f"ranks_{sizes['rows']}_{sizes['shards']}"
    resume_dir = workdir / f"resume_{sizes['resume_shard_rows']}"
    write_corpus(ranks_dir, sizes["rows"], sizes["shards"])
    write_corpus(resume_dir, sizes["resume_shard_rows"], 1)
    ranks = rank_scaling(ranks_dir, sizes["rows"], rounds)
    row_bytes = mean_row_bytes(ranks_dir)
    result = {
        "ranks": ranks,
        "coordinator_row_bytes": round(ranks.pop("_over_read_per_row") * row_bytes, 3),
        "row_bytes": round(row_bytes, 1),
        "resume": resume_cost(resume_dir, sizes["resume_shard_rows"], sizes["resume_rows"], rounds),
        "shuffle": shuffle_statistics(),
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(markdown_table(
        ["W", "rows read per row", "delivered rows/s", "per rank rows/s"],
        [[w, r["rows_read_per_row"], r["delivered_per_s"], r["per_rank_per_s"]]
         for w, r in result["ranks"].items()],
    ))  # fmt: skip
    print()
    print(markdown_table(
        ["resume at", "shard rows", "state bytes", "delivered vs fresh"],
        [[k, r["shard_rows"], r["state_bytes"], r["delivered_vs_fresh"]]
         for k, r in result["resume"].items()],
    ))  # fmt: skip
    print()
    print(json.dumps(result["shuffle"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
