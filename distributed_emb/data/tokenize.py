"""Tokenisation as a Ray Data stage: token ids made on the cluster's CPUs, not in the worker.

On a GPU the encoder consumes tens of thousands of sentences a second, more than one
tokenising thread in each Train worker can feed. With `data.tokenize_in=ray_data` each rank's
stream (data/sharding.py) gains a `map_batches` stage that tokenises and truncates its rows
in Ray Data tasks, on whatever CPUs the cluster has left after the Train workers, and hands
the worker lists of token ids; the worker only pads, builds the MLM mask and moves the batch
to the device (data/collate.py reads `<column>__ids` when present). The ids are exactly what
the worker-side tokenizer makes (tests/data/test_tokenize.py).
"""

from __future__ import annotations

import pyarrow as pa

IDS_SUFFIX = "__ids"
TRUNCATED_SUFFIX = "__truncated"

_TOKENIZERS: dict[tuple[str, bool], object] = {}  # one per Ray worker process, reused


def _tokenizer(path: str, trust_remote_code: bool):
    key = (path, trust_remote_code)
    if key not in _TOKENIZERS:
        from transformers import AutoTokenizer  # heavy: only where a stage runs

        _TOKENIZERS[key] = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    return _TOKENIZERS[key]


def tokenize_columns(
    table: pa.Table,
    tokenizer_path: str,
    max_seq_length: int,
    columns: list[str],
    trust_remote_code: bool = False,
) -> pa.Table:
    """Replace each text column by its token ids (truncated to `max_seq_length`, with the
    special tokens) and a flag saying whether truncation cut it."""
    tokenizer = _tokenizer(tokenizer_path, trust_remote_code)
    for column in columns:
        texts = [str(t) for t in table.column(column).to_pylist()]
        encoded = tokenizer(texts, truncation=True, max_length=max_seq_length)
        encodings = getattr(encoded, "encodings", None) or []
        truncated = [bool(e.overflowing) for e in encodings] or [False] * len(texts)
        index = table.column_names.index(column)
        table = table.remove_column(index)
        table = table.append_column(
            column + IDS_SUFFIX, pa.array(encoded["input_ids"], pa.list_(pa.int32()))
        )
        table = table.append_column(column + TRUNCATED_SUFFIX, pa.array(truncated, pa.bool_()))
    return table


def tokenize_in_ray_data(config) -> bool:
    """`data.tokenize_in`: auto tokenises in Ray Data on GPU runs (where one worker thread
    cannot keep up) and in the worker on CPU runs (where a step costs ~100× the tokenising)."""
    choice = config.data.tokenize_in
    return config.train.use_gpu if choice == "auto" else choice == "ray_data"


def tokenize_stage(config) -> dict | None:
    """The map_batches arguments of the stage for a training config, or None."""
    if not tokenize_in_ray_data(config):
        return None
    from distributed_emb.data.corpus import corpus_columns

    return {
        "fn": tokenize_columns,
        "fn_kwargs": {
            "tokenizer_path": config.model_path,
            "max_seq_length": config.model.max_seq_length,
            "columns": corpus_columns(config.data),
            "trust_remote_code": config.model.trust_remote_code,
        },
        "batch_size": config.data.tokenize_batch_rows,
        "batch_format": "pyarrow",
    }
