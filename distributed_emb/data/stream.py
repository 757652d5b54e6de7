"""Streamed sources: a corpus read as it streams, in the epoch's order, with no prepare pass.

- `FileSource`: files read by Ray Data tasks, one task per file, in the epoch's order
  (`preserve_order`, data/epoch_order.py), then cleaned with exact drop counts
  (data/corpus.py), optionally de-duplicated and tokenised; served to the ranks by the run's
  feeder actor (data/global_batches.py). A resumed epoch opens no file before its position.
- `BlockSource`: blocks already in the object store (a Tune search that cannot share a token
  cache reads the corpus once for all its trials); each block is one unit of the order.

`training_dataset` is the same clean corpus in file order, for the token cache's prepare pass
(data/token_cache.py). Which source a run trains on is decided in data/training_stream.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from distributed_emb.data.corpus import (
    STREAM_BLOCK_BYTES,
    KeepCleanRows,
    KeepFirstCopies,
    _with_text_key,
    corpus_path,
    text_rules,
)
from distributed_emb.data.data_config import DataConfig
from distributed_emb.data.epoch_order import (
    BLOCK,
    SEQUENCE,
    DataPosition,
    EpochOrder,
    ordered_block,
    read_plan,
)
from distributed_emb.data.readers import (
    DROP,
    WHERE,
    RowRules,
    corpus_datasource,
    read_unit_blocks,
)
from distributed_emb.data.sources import CorpusFiles, resolve_sources

log = logging.getLogger(__name__)


@dataclass
class FileSource:
    """Files → clean (→ tokenised) rows in an epoch's order, on Ray Data tasks."""

    files: CorpusFiles
    rules: RowRules
    block_rows: int
    counter: object | None = None  # the DropCounter actor that counts the cleaning's drops
    stages: list[dict] = field(default_factory=list)  # map_batches arguments after cleaning
    deduplicate: bool = False
    dedup_partitions: int = 16

    @property
    def fingerprint(self) -> str:
        """What decides the stream's rows and their block bounds: the files (paths, sizes),
        the reading rules and the block size."""
        parts = [
            [[f.path, f.size] for f in self.files.files],
            repr(self.rules),
            self.block_rows,
            self.deduplicate,
        ]
        return "files:" + _digest(parts)

    @property
    def cleans(self) -> bool:
        """Text rows are cleaned (and counted); stored shards were cleaned when written."""
        return not getattr(self.rules, "stored", False)

    def dataset(self, order: EpochOrder | None, start: DataPosition | None = None):
        """The epoch's rows from `start`'s block on, as a lazy Ray Dataset in order; `order`
        None: the files as listed, rows as read, untagged (one pass: counting, the token
        cache's build)."""
        import ray  # startup

        # De-duplication keeps a row's first copy in the whole corpus: it must see every
        # file, so a resumed epoch reads from the start and the feeder skips by position.
        first_block = 0 if self.deduplicate or start is None else start.block
        with_sequence = self.deduplicate and order is not None
        source = corpus_datasource(
            self.files, self.rules, self.block_rows, order, first_block, with_sequence
        )
        dataset = ray.data.read_datasource(source)
        context = dataset.context
        # Small blocks reach the consumer as soon as they are read: with Ray Data's default
        # (128 MiB) a 1M-sentence shard is buffered whole before its first row moves on.
        context.target_max_block_size = STREAM_BLOCK_BYTES
        context.execution_options.preserve_order = True  # the order is the point
        if self.cleans:
            dataset = dataset.map_batches(
                KeepCleanRows(self.counter), batch_size=None, batch_format="pyarrow"
            )
        if self.deduplicate:
            dataset = dataset.map_batches(
                _with_text_key,
                fn_kwargs={"columns": self.rules.fields},
                batch_size=None,
                batch_format="pyarrow",
            )
            dataset = dataset.repartition(max(1, self.dedup_partitions), keys=["_text_key"])
            dataset = dataset.map_batches(
                KeepFirstCopies(self.counter), batch_size=None, batch_format="pyarrow"
            )
            if with_sequence:  # the hash partitioning scattered the order: put it back
                dataset = dataset.sort([BLOCK, SEQUENCE]).drop_columns([SEQUENCE])
        for stage in self.stages:
            stage = dict(stage)
            dataset = dataset.map_batches(stage.pop("fn"), **stage)
        return dataset

    def epoch_tables(self, order: EpochOrder, start: DataPosition) -> Iterator[pa.Table]:
        dataset = self.dataset(order, start)
        yield from dataset.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=4)


def local_epoch_tables(
    source: FileSource, order: EpochOrder, start: DataPosition
) -> Iterator[pa.Table]:
    """FileSource's epoch (before its stages), read in this process without Ray: the
    single-process reference the Ray path is tested against. No de-duplication."""
    for unit, ordinal, skip in read_plan(order, len(source.files.files), start.block):
        file, filesystem = source.files.files[unit], source.files.filesystems[unit]
        for block in read_unit_blocks(
            filesystem, file, source.rules, source.block_rows, order, unit, ordinal, skip
        ):
            if source.cleans:  # what KeepCleanRows keeps
                block = block.filter(pc.equal(block.column(DROP), "")).drop_columns([DROP, WHERE])
            yield block


@dataclass
class BlockSource:
    """Blocks already in the object store, each a unit of the epoch's order (one source block
    per unit). Read in the feeder's own process: no Ray Data execution per epoch."""

    blocks: list  # ObjectRefs of Arrow tables, in the dataset's order

    @classmethod
    def of(cls, dataset) -> BlockSource:
        refs = [ref for bundle in dataset.iter_internal_ref_bundles() for ref in bundle.block_refs]
        return cls(refs)

    @property
    def fingerprint(self) -> str:
        return f"blocks:{len(self.blocks)}"

    def epoch_tables(self, order: EpochOrder, start: DataPosition) -> Iterator[pa.Table]:
        import ray  # startup
        from ray.data.block import BlockAccessor

        for unit, ordinal, _ in read_plan(order, len(self.blocks), start.block):
            table = BlockAccessor.for_block(ray.get(self.blocks[unit])).to_arrow()
            yield ordered_block(table, order, unit, ordinal, 0)


def _digest(parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def text_source(data_config: DataConfig, counter, stages: list[dict] | None = None) -> FileSource:
    """The text corpus of `data_config` as a FileSource."""
    files = resolve_sources(corpus_path(data_config), data_config.hf_split)
    log.info("corpus: %s", files.describe())
    return FileSource(
        files,
        text_rules(data_config),
        data_config.block_rows,
        counter,
        list(stages or []),
        data_config.deduplicate,
        data_config.dedup_partitions,
    )


def training_dataset(data_config: DataConfig, counter):
    """The clean corpus in file order as a lazy Ray Dataset {columns..., _row_id}, limited to
    `data.max_rows`: one pass for the token cache's build and a Tune search's shared blocks.
    Nothing is read here: reading starts when the dataset is consumed."""
    dataset = text_source(data_config, counter).dataset(None)
    if data_config.max_rows is not None:
        dataset = dataset.limit(data_config.max_rows)
    return dataset


def count_rows(data: DataConfig, source: FileSource | BlockSource) -> int:
    """The corpus's clean row count (at most `data.max_rows`): one full read pass, which the
    schedule needs when the run's length is whole epochs."""
    log.info("counting the corpus (one read pass; set train.max_steps to start at once)")
    if isinstance(source, BlockSource):
        import ray  # startup
        from ray.data.block import BlockAccessor

        rows = sum(BlockAccessor.for_block(ray.get(b)).num_rows() for b in source.blocks)
    else:
        rows = dataclasses.replace(source, stages=[]).dataset(None).count()
    if data.max_rows is not None:
        rows = min(rows, data.max_rows)
    return rows
