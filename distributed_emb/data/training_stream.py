"""The driver side of data/: `training_stream(data, stream)`, what a run trains on.

There is one data path. Every corpus, local or remote, text or columnar, is read once by Ray
Data into indexed token shards (data/token_cache.py: read → clean → tokenise → Arrow IPC
shards with an index, reused by every later run with the same key), and each rank then reads
its own rows of each global batch from the shards (data/rank_batches.py `RankBatches`). One
epoch order, one position a checkpoint keeps (data/epoch_plan.py `DataPosition`), one count of
the rows dropped (the build's, kept in its commit).

`training_stream` returns a `TrainingStream`: the picklable source the workers read, the row
count the schedule needs (the build counted it), the drop report, and the identity of the
stream that a checkpoint's position indexes. The settings come as the `data` section
(`DataConfig`) and `StreamSettings`, what the data path needs from the other sections,
resolved once on the driver.
"""

from __future__ import annotations

from dataclasses import dataclass

from distributed_emb.data.data_config import DataConfig
from distributed_emb.data.epoch_plan import BatchPlan
from distributed_emb.data.rank_batches import IndexedSource
from distributed_emb.data.readers import DropReport
from distributed_emb.data.stream_settings import StreamSettings
from distributed_emb.data.token_cache import token_shards
from distributed_emb.errors import UserInputError


@dataclass
class TrainingStream:
    """What a run trains on: the shards, their clean row count and what the build dropped."""

    source: IndexedSource
    rows: int
    report: DropReport | None = None

    def identity(self, plan: BatchPlan) -> dict:
        """What a position of this stream indexes (kept beside it in every checkpoint): a
        position applied to a stream with another identity would train other rows."""
        return {
            "rows": self.source.fingerprint,
            "seed": plan.seed,
            "global_batch": plan.global_batch,
            "length_group": plan.length_group,
            "max_rows": plan.max_rows,
        }


class StreamChangedError(UserInputError):
    """A checkpoint's data position belongs to another stream than the one the run builds."""


def check_same_stream(stored: dict | None, current: dict, where: str) -> None:
    """Refuse to apply a position taken on stream `stored` to stream `current`, naming what
    changed (a checkpoint from before positions carried their stream: nothing to compare)."""
    if not stored:
        return
    changed = [
        f"{key} {stored.get(key)!r} → {current.get(key)!r}"
        for key in sorted(set(stored) | set(current))
        if stored.get(key) != current.get(key)
    ]
    if changed:
        raise StreamChangedError(
            f"{where}: its data position indexes another stream than this run's "
            f"({'; '.join(changed)}); a resume would train other rows than the checkpoint "
            f"says. Restore the data settings (data.*, the token cache) or start a new run "
            f"(--overwrite or another output.run_name)"
        )


def training_stream(data: DataConfig, stream: StreamSettings) -> TrainingStream:
    """The run's stream: the corpus's indexed token shards, reused when a build with this key
    is committed, else built now (one Ray Data pass on the cluster; Ray must be up)."""
    shards = token_shards(data, stream)
    return TrainingStream(IndexedSource(shards.index), shards.rows, shards.report)
