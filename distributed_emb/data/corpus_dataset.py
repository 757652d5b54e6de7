"""The clean corpus as a lazy Ray Dataset: the one read of a training corpus, on the cluster.

`training_dataset(data, counter)` lists the files on the driver (data/sources.py: names and
sizes, no rows) and reads them in Ray Data tasks, one per file (data/readers.py: any format,
local or remote), then cleans the rows with exact drop counts (data/corpus.py `KeepCleanRows`)
and, with `data.deduplicate`, keeps each text's first copy. Nothing of the corpus passes
through the driver.

Its consumers: the token cache's build (data/token_cache.py: every training run and Tune
search reads its corpus through it into indexed shards), and the embed job's calibration
sample (vectors/corpus_embedding.py).

Rows come in corpus order (files as listed, rows as read), each with its stable `_row_id`
(data/readers.py), so the shards built from them, and the epochs cut from the shards, depend
on the corpus alone.
"""

from __future__ import annotations

import logging

from distributed_emb.data.corpus import (
    STREAM_BLOCK_BYTES,
    KeepCleanRows,
    KeepFirstCopies,
    _with_text_key,
    corpus_path,
    text_rules,
)
from distributed_emb.data.data_config import DataConfig
from distributed_emb.data.readers import ROW_ID, corpus_datasource
from distributed_emb.data.sources import resolve_sources

log = logging.getLogger(__name__)


def training_dataset(data_config: DataConfig, counter):
    """The clean corpus in corpus order as a lazy Ray Dataset {columns..., _row_id}, limited
    to the first `data.max_rows` clean rows; `counter`: the DropCounter actor that counts the
    cleaning's drops (data/corpus.py `start_drop_counter`), or None. Nothing is read here:
    reading starts when the dataset is consumed."""
    import ray  # startup

    files = resolve_sources(corpus_path(data_config), data_config.hf_split)
    log.info("corpus: %s", files.describe())
    rules = text_rules(data_config)
    dataset = ray.data.read_datasource(corpus_datasource(files, rules, data_config.block_rows))
    context = dataset.context
    # Small blocks move on as soon as they are read: with Ray Data's default (128 MiB) a
    # 1M-sentence file is buffered whole before its first row reaches the next stage.
    context.target_max_block_size = STREAM_BLOCK_BYTES
    context.execution_options.preserve_order = True  # corpus order: the shards' row order
    dataset = dataset.map_batches(KeepCleanRows(counter), batch_size=None, batch_format="pyarrow")
    if data_config.deduplicate:
        dataset = dataset.map_batches(
            _with_text_key,
            fn_kwargs={"columns": rules.fields},
            batch_size=None,
            batch_format="pyarrow",
        )
        dataset = dataset.repartition(max(1, data_config.dedup_partitions), keys=["_text_key"])
        dataset = dataset.map_batches(
            KeepFirstCopies(counter), batch_size=None, batch_format="pyarrow"
        )
        # The hash partitioning scattered the rows: back to corpus order (row ids are file
        # index, then line), so `max_rows` keeps the first clean rows and a rebuild the same.
        dataset = dataset.sort(ROW_ID)
    if data_config.max_rows is not None:
        dataset = dataset.limit(data_config.max_rows)
    return dataset
