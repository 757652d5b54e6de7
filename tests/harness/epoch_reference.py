"""What a config's epoch must train, global batch by global batch: the single-process reference
that runs are compared with (no Ray, none of the product's reading code).

The rows are the config's committed token shards, found where its run built them (the
config's token-cache key, data/token_cache.py), local or on object storage. The epoch's order
is data/shuffle.py's `ShardOrder` over the whole epoch at once, cut into global batches of G
rows; with length grouping each pool of k·G rows is sorted by the shards' `_length` (stable)
and its batches visited in the seed's order. Whatever its number of workers, resizes or
restarts, a run of the config trains exactly these batches.
"""

from __future__ import annotations


def committed_index(config):
    """The ShardIndex of `config`'s committed token shards (a run of it built them)."""
    from distributed_emb.data.token_cache import cache_key, committed_shards, key_id
    from distributed_emb.storage import join

    settings = config.stream_settings()
    directory = join(settings.token_cache_root, key_id(cache_key(config.data, settings)))
    shards = committed_shards(directory)
    assert shards is not None, f"{directory}: no committed token shards (train the config first)"
    return shards.index


def reference_batches(config, epoch: int = 0) -> list[list[int]]:
    """Row ids of every global batch of `config`'s epoch, in order."""
    import numpy as np
    import pyarrow as pa

    from distributed_emb.data.epoch_plan import EpochOrder, batch_plan
    from distributed_emb.data.indexed_shards import LENGTH
    from distributed_emb.data.readers import ROW_ID
    from distributed_emb.data.shuffle import ShardOrder
    from distributed_emb.storage import filesystem_of, join

    index = committed_index(config)
    tables = []
    for name, _ in index.shards:
        filesystem, path = filesystem_of(join(index.directory, name))
        with filesystem.open_input_file(path) as handle:
            tables.append(pa.ipc.open_file(handle).read_all().select([ROW_ID, LENGTH]))
    rows = pa.concat_tables(tables)
    row_ids, lengths = rows.column(ROW_ID).to_numpy(), rows.column(LENGTH).to_numpy()

    plan = batch_plan(config.data, config.train.global_batch)
    size, group = plan.global_batch, plan.length_group
    order = ShardOrder(index.shard_rows, plan.seed, epoch).rows(0, len(row_ids))
    batches = []
    for begin in range(0, len(order) - size + 1, size * group):
        count = len(order[begin : begin + size * group]) // size
        pool = order[begin : begin + count * size]
        if group > 1:
            by_length = pool[np.argsort(lengths[pool], kind="stable")].reshape(count, size)
            batches.extend(by_length[EpochOrder(plan.seed, epoch).pool_batches(begin, count)])
        else:
            batches.extend(pool.reshape(count, size))
    return [row_ids[batch].tolist() for batch in batches]
