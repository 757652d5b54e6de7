"""How Ray Train hands the streaming corpus to its workers: a fixed shard per rank.

Ray Train's default `streaming_split` deals blocks to whichever worker asks first, so which
rows a worker sees changes from run to run. Exact resume needs the opposite: after a restart,
rank r must be able to skip precisely the rows it already trained on this epoch. So each rank
takes the rows whose stable row id (data/readers.py) falls in its residue class; every rank's
stream is its own Ray Data pipeline (read → clean → select), run on the cluster's CPUs with
the execution options Ray Train sets for ingest (its workers' resources excluded).

Cost: every rank's pipeline reads every file and keeps 1/W of the rows; parsing is cheap next
to tokenising and training, which happen once per row. Ranks' shards differ by at most a few
rows; the loop ends an epoch when any rank runs out (train/loop.py), so every rank takes the
same number of steps.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from ray.train import DataConfig

from distributed_emb.data.readers import FILE_BITS, ROW_ID


def rank_of_rows(row_ids: np.ndarray, world_size: int) -> np.ndarray:
    """The rank that trains each row: mixes file index and line so every file is spread."""
    return (row_ids + (row_ids >> FILE_BITS)) % world_size


def select_rank(block: pa.Table, rank: int, world_size: int) -> pa.Table:
    ids = block.column(ROW_ID).to_numpy()
    return block.filter(pa.array(rank_of_rows(ids, world_size) == rank))


class RowShardedDataConfig(DataConfig):
    """Rank r's iterator streams exactly the rows with rank_of_rows(id) == r.

    `per_rank_stage`: map_batches arguments ({"fn": ..., "fn_kwargs": ..., ...}) of a stage run
    on each rank's rows after the selection, e.g. tokenisation (data/tokenize.py): work done
    once per row, on the cluster's CPUs."""

    def __init__(self, *args, per_rank_stage: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.per_rank_stage = per_rank_stage

    def configure(self, datasets, world_size, worker_handles, worker_node_ids, **kwargs):
        output = [{} for _ in range(world_size)]
        for name, dataset in datasets.items():
            for rank in range(world_size):
                shard = dataset.map_batches(
                    select_rank,
                    fn_kwargs={"rank": rank, "world_size": world_size},
                    batch_size=None,
                    batch_format="pyarrow",
                )
                if self.per_rank_stage is not None:
                    stage = dict(self.per_rank_stage)
                    shard = shard.map_batches(stage.pop("fn"), **stage)
                shard.context.execution_options = self._resolve_execution_options(name)
                output[rank][name] = shard.iterator()
        return output
