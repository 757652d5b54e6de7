"""Tokenisation as a Ray Data stage: token ids made on the cluster's CPUs, once per corpus.

The token cache's build (data/token_cache.py) runs this stage over the clean corpus and writes
its output into the indexed shards every run trains from, so the Train workers never
tokenise: they only pad, build the MLM mask and move the batch to the device (data/collate.py
reads `<column>__ids`). On a GPU the encoder consumes tens of thousands of sentences a second,
more than a tokenising thread in each worker could feed; tokenised once, later epochs, resumed
runs and Tune trials pay nothing. The ids are exactly what the tokenizer called on the text
makes (tests/data/test_tokenize.py, tests/data/test_token_cache.py)."""

from __future__ import annotations

import itertools
import logging

import numpy as np
import pyarrow as pa
from tokenizers import Tokenizer

from distributed_emb.data.corpus import corpus_columns
from distributed_emb.data.data_config import DataConfig
from distributed_emb.data.stream_settings import StreamSettings

IDS_SUFFIX = "__ids"
TRUNCATED_SUFFIX = "__truncated"
CHECK_ROWS = 64  # rows of a process's first block tokenised both ways (see TextEncoder)

log = logging.getLogger(__name__)

_ENCODERS: dict[tuple[str, int, bool], TextEncoder] = {}  # one per Ray worker process, reused


class TextEncoder:
    """Texts → token ids (truncated to `max_length`, special tokens added) and truncation flags,
    as Arrow arrays: exactly what `tokenizer(texts, truncation=True, max_length=...)` gives.

    A fast tokenizer is driven through its Rust backend directly: `encode_batch_fast` (no
    character offsets, which nobody here reads) on a private copy with truncation set once,
    ids flattened straight into an Arrow list array. That skips the Python-side conversion of
    every row's ids, type ids and attention mask into lists, which cost about a third of the
    stage (docs/BENCHMARKS.md, tokenising data path). The first block each process sees is
    also tokenised through the ordinary call; if the two ever differ (a tokenizer that does
    work in Python), this encoder says so once and uses the ordinary call from then on."""

    def __init__(self, tokenizer, max_length: int):
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.backend = None
        fast = getattr(tokenizer, "backend_tokenizer", None)
        if fast is not None:
            backend = Tokenizer.from_str(fast.to_str())  # a copy: the tokenizer's state untouched
            backend.no_padding()
            backend.enable_truncation(
                max_length, strategy="longest_first", direction=tokenizer.truncation_side
            )
            self.backend = backend
        self.checked = False

    def __call__(self, texts: list[str]) -> tuple[pa.Array, pa.Array]:
        if self.backend is None:
            return self.reference(texts)
        encode = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
        encodings = encode(texts)
        lengths = np.fromiter((len(e) for e in encodings), np.int32, len(encodings))
        offsets = np.zeros(len(encodings) + 1, np.int32)
        np.cumsum(lengths, out=offsets[1:])
        values = np.fromiter(
            itertools.chain.from_iterable(e.ids for e in encodings), np.int32, int(offsets[-1])
        )
        ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        truncated = pa.array([bool(e.overflowing) for e in encodings], pa.bool_())
        if not self.checked:
            self.checked = True
            expected = self.reference(texts[:CHECK_ROWS])
            if not (
                expected[0].equals(ids[:CHECK_ROWS]) and expected[1].equals(truncated[:CHECK_ROWS])
            ):
                log.warning(
                    "%s: its Rust backend alone gives other ids than the tokenizer; "
                    "tokenising through the tokenizer (slower)",
                    type(self.tokenizer).__name__,
                )
                self.backend = None
                return self.reference(texts)
        return ids, truncated

    def reference(self, texts: list[str]) -> tuple[pa.Array, pa.Array]:
        """The ordinary tokenizer call: what the worker-side collator does."""
        encoded = self.tokenizer(
            texts,
            truncation=True,
            max_length=self.max_length,
            return_attention_mask=False,
            return_token_type_ids=False,
        )
        encodings = getattr(encoded, "encodings", None) or []
        truncated = [bool(e.overflowing) for e in encodings] or [False] * len(texts)
        return (
            pa.array(encoded["input_ids"], pa.list_(pa.int32())),
            pa.array(truncated, pa.bool_()),
        )


def text_encoder(path: str, max_length: int, trust_remote_code: bool = False) -> TextEncoder:
    key = (path, max_length, trust_remote_code)
    if key not in _ENCODERS:
        # Here, not at the top: the column names above are read by processes that never
        # tokenise (a rank reading its shards), and transformers brings torch (~2 s of CPU).
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        _ENCODERS[key] = TextEncoder(tokenizer, max_length)
    return _ENCODERS[key]


def tokenize_columns(
    table: pa.Table,
    tokenizer_path: str,
    max_seq_length: int,
    columns: list[str],
    trust_remote_code: bool = False,
) -> pa.Table:
    """Replace each text column by its token ids (truncated to `max_seq_length`, with the
    special tokens) and a flag saying whether truncation cut it."""
    encoder = text_encoder(tokenizer_path, max_seq_length, trust_remote_code)
    for column in columns:
        values = table.column(column)
        texts = values.to_pylist()
        if not pa.types.is_string(values.type) and not pa.types.is_large_string(values.type):
            texts = [str(t) for t in texts]
        ids, truncated = encoder(texts)
        table = table.remove_column(table.column_names.index(column))
        table = table.append_column(column + IDS_SUFFIX, ids)
        table = table.append_column(column + TRUNCATED_SUFFIX, truncated)
    return table


def tokenize_arguments(data: DataConfig, stream: StreamSettings) -> dict:
    """map_batches arguments that tokenise the corpus columns ({"fn": ..., ...})."""
    return {
        "fn": tokenize_columns,
        "fn_kwargs": {
            "tokenizer_path": stream.tokenizer,
            "max_seq_length": stream.max_seq_length,
            "columns": corpus_columns(data),
            "trust_remote_code": stream.trust_remote_code,
        },
        "batch_size": data.tokenize_batch_rows,
        "batch_format": "pyarrow",
    }
