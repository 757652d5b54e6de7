"""The driver side of data/: `training_stream(data, stream)`, what a run trains on.

It decides where a run's rows come from and returns a `TrainingStream`: a picklable *source*,
the clean row count when the schedule needs it, and the identity of the stream that a
checkpoint's position indexes. The worker side (data/rank_batches.py `open_rank_stream`) turns
the source into each rank's slices of the epoch's global batches.

Sources:
- `IndexedSource` (data/rank_batches.py): the token cache's indexed shards (`data.token_cache`,
  data/token_cache.py); every rank reads its own rows.
- `FileSource` / `BlockSource` (data/stream.py): a corpus streamed in the epoch's order through
  the run's feeder (data/global_batches.py).

The settings come as the `data` section (`DataConfig`) and `StreamSettings`, what the stream
needs from the other sections, resolved once on the driver.
"""

from __future__ import annotations

from dataclasses import dataclass

from distributed_emb.data.corpus import collect_report, start_drop_counter
from distributed_emb.data.data_config import DataConfig
from distributed_emb.data.global_batches import BatchPlan
from distributed_emb.data.rank_batches import IndexedSource
from distributed_emb.data.stream import BlockSource, FileSource, count_rows, text_source
from distributed_emb.data.stream_settings import StreamSettings
from distributed_emb.data.token_cache import token_shards
from distributed_emb.data.tokenize import tokenize_stage
from distributed_emb.errors import UserInputError


@dataclass
class TrainingStream:
    """What a run trains on: the source, its clean row count when the schedule needs one,
    and how to get the drop report once the run has read it."""

    source: IndexedSource | FileSource | BlockSource
    rows: int | None
    pretokenised: bool
    report: object = None  # a DropReport known up front (a token cache), else None
    counter: object = None  # the DropCounter actor to collect the report from

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

    def corpus_report(self):
        if self.report is not None:
            return self.report
        return collect_report(self.counter) if self.counter is not None else None


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


def training_stream(
    data: DataConfig, stream: StreamSettings, search: bool = False
) -> TrainingStream:
    """The run's stream: the token cache's indexed shards when the cache is on (built now if
    needed; every rank reads its own rows), else the text corpus, cleaned on the cluster and
    tokenised there when `data.tokenize_in` says so, through the run's feeder."""
    shards = token_shards(data, stream, search=search)
    if shards is not None:
        rows = shards.rows if stream.max_steps is None else None
        source = IndexedSource(shards.index)
        return TrainingStream(source, rows, pretokenised=True, report=shards.report)
    counter = start_drop_counter()
    stage = tokenize_stage(data, stream)
    source = text_source(data, counter, [stage] if stage else [])
    rows = None if stream.max_steps is not None else count_rows(data, source)
    return TrainingStream(source, rows, pretokenised=stage is not None, counter=counter)
