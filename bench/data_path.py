"""The data path alone: how fast the project reads, cleans and tokenises sentences, to set
against how fast training consumes them.

Three stages, each timed on its own:
- read + clean: `load_training_dataset` (the driver's streaming pass over the corpus: UTF-8
  checks, empty and duplicate rows dropped and counted) into a Ray Dataset;
- Ray Data → worker batches: `iter_torch_batches` with the workers' collator (tokenisation
  into two views, dynamic padding), consumed as fast as it comes, in one consumer (the first
  batch, which waits for the pipeline to start, timed apart);
- tokenise only: the same collator on in-memory lists, no Ray (the floor of the stage above).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np


@dataclass
class DataPathTiming:
    rows: int
    read_s: float  # read + clean + Ray Dataset creation
    first_batch_s: float  # Ray Data start-up: latency of the first batch
    iterate_sentences_per_s: float  # Ray Data iter_torch_batches + collate, one consumer
    tokenise_sentences_per_s: float  # collator only, no Ray


def time_data_path(
    model_path: str,
    batch_size: int,
    max_seq_length: int,
    max_batches: int,
    data_overrides: list[str] = (),
) -> DataPathTiming:
    from transformers import AutoTokenizer

    from distributed_emb.config import DataConfig, load_config
    from distributed_emb.data.collate import ContrastiveCollator
    from distributed_emb.data.corpus import start_drop_counter, training_dataset

    data_config = load_config(DataConfig, None, list(data_overrides))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    collate = ContrastiveCollator(tokenizer, max_seq_length)

    started = time.perf_counter()
    counter = start_drop_counter()
    dataset = training_dataset(data_config, counter)
    rows = dataset.count()
    read_s = time.perf_counter() - started

    # The first batch pays the streaming executor's start-up (once per epoch, hidden behind
    # the first window in training): timed on its own; throughput is over the batches after it.
    sentences = 0
    started = time.perf_counter()
    for index, batch in enumerate(
        dataset.iter_torch_batches(batch_size=batch_size, collate_fn=collate, drop_last=True)
    ):
        if index == 0:
            first_batch_s = time.perf_counter() - started
            started = time.perf_counter()
            continue
        sentences += batch["input_ids"].shape[0] // 2
        if index >= max_batches:
            break
    iterate = sentences / (time.perf_counter() - started)

    texts = [row["text"] for row in dataset.take(max_batches * batch_size)]
    started = time.perf_counter()
    for start in range(0, len(texts) - batch_size + 1, batch_size):
        collate({"text": np.array(texts[start : start + batch_size], dtype=object)})
    tokenise = (len(texts) // batch_size * batch_size) / (time.perf_counter() - started)
    return DataPathTiming(rows, read_s, first_batch_s, iterate, tokenise)
