"""The run's feeder actor (data/global_batches.py) with its ranks played by the test process:
what `world` ranks receive, global batch by global batch."""

from __future__ import annotations


def served_batches(source, plan, world: int, start, chunk_rows: int | None = None):
    """[(global batch as the ranks' slices concatenated in rank order, position after it)].
    Checks on the way that every rank gets a slice of every batch, of split_rows' size, with
    the same position. `chunk_rows`: the feeder's chunk size (default the product's; 1: a
    chunk per global batch, so an epoch runs through many chunks and the feeder's buffer)."""
    import pyarrow as pa
    import ray

    from distributed_emb.data.global_batches import (
        CHUNK_ROWS,
        GlobalBatchFeeder,
        RankStream,
        split_rows,
    )

    feeder = (
        ray.remote(GlobalBatchFeeder)
        .options(num_cpus=0, max_concurrency=4 * world + 4)
        .remote(source, plan, world, chunk_rows or CHUNK_ROWS)
    )
    try:
        ranks = [RankStream(feeder, rank).epoch(start) for rank in range(world)]
        served = []
        while True:
            slices = [next(rank, None) for rank in ranks]
            if all(s is None for s in slices):
                return served
            assert None not in slices, "ranks got different numbers of batches"
            spans = [split_rows(plan.global_batch, world, rank) for rank in range(world)]
            assert [table.num_rows for table, _ in slices] == [b - a for a, b in spans]
            assert len({position for _, position in slices}) == 1
            served.append((pa.concat_tables([table for table, _ in slices]), slices[0][1]))
    finally:
        ray.kill(feeder)


def reference_batches(config, epoch: int = 0) -> list[list[int]]:
    """Row ids of every global batch of `config`'s epoch, in order, read in this process (no
    Ray): what any run of that config trains, whatever its number of workers or restarts."""
    from distributed_emb.data.epoch_order import DataPosition, EpochOrder
    from distributed_emb.data.global_batches import batch_plan, global_batches
    from distributed_emb.data.stream import local_epoch_tables, text_source

    source = text_source(config.data, counter=None)
    plan = batch_plan(config.data, config.train.global_batch)
    tables = local_epoch_tables(source, EpochOrder(plan.seed, epoch), DataPosition(epoch=epoch))
    return [
        batch.column("_row_id").to_pylist()
        for batch, _ in global_batches(tables, plan, DataPosition(epoch=epoch))
    ]
