"""Sentence corpora (txt, JSONL, Parquet, HF datasets) → a clean Ray Dataset, with counted drops.

Cleaning is one streaming pass on the driver: every dropped row is counted by reason, and the
first few are logged with their file and line, so a user sees exactly what was lost. The clean
rows become a Ray Dataset that Ray Train splits across workers (`get_dataset_shard`), where
tokenisation happens. Over-long rows are kept and truncated by the tokenizer in the workers
(counted there, see data/collate.py).

Why the driver: exact global de-duplication and exact counts need one pass over all rows; a
sentence corpus of tens of millions of lines fits comfortably (a few GB of Arrow strings). For
larger corpora, pre-shard into several files/runs.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

log = logging.getLogger(__name__)

MAX_LOGGED_EXAMPLES = 5
SUFFIX_FORMATS = {".txt": "txt", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}


class CorpusError(ValueError):
    """A corpus cannot be read at all (missing file, missing column); names file/column."""


@dataclass
class CorpusReport:
    """What the cleaning pass kept and dropped, by reason."""

    kept: int = 0
    dropped: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)  # "file:line: reason" for the first few

    def drop(self, reason: str, where: str) -> None:
        self.dropped[reason] += 1
        if len(self.examples) < MAX_LOGGED_EXAMPLES:
            self.examples.append(f"{where}: {reason}")
            log.warning("corpus: dropped %s: %s", where, reason)

    @property
    def total(self) -> int:
        return self.kept + sum(self.dropped.values())

    def as_dict(self) -> dict:
        return {
            "read": self.total,
            "kept": self.kept,
            "dropped": dict(self.dropped),
            "examples": list(self.examples),
        }

    def summary(self) -> str:
        parts = ", ".join(f"{k}={v}" for k, v in sorted(self.dropped.items())) or "none"
        return f"corpus: read {self.total} rows, kept {self.kept}, dropped: {parts}"


def detect_format(path: str, declared: str) -> str:
    if declared != "auto":
        return declared
    p = Path(path)
    if p.is_dir():
        if (p / "dataset_info.json").exists() or (p / "dataset_dict.json").exists():
            return "hf"
        suffixes = {f.suffix for f in p.iterdir() if f.is_file()}
        for suffix, fmt in SUFFIX_FORMATS.items():
            if suffix in suffixes:
                return fmt
        raise CorpusError(f"{path}: directory holds no .txt, .jsonl or .parquet files")
    if p.suffix in SUFFIX_FORMATS:
        return SUFFIX_FORMATS[p.suffix]
    if not p.exists():
        return "hf"  # a hub dataset name
    raise CorpusError(f"{path}: cannot tell the format from the suffix; set data.format")


def _files(path: str, suffixes: tuple[str, ...]) -> list[Path]:
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix in suffixes)
        if not files:
            raise CorpusError(f"{path}: no {'/'.join(suffixes)} files in directory")
        return files
    if not p.is_file():
        raise CorpusError(f"{path}: file does not exist")
    return [p]


# Each reader yields (row dict | None, where, reason-if-None) for every physical row.
Row = tuple[dict | None, str, str | None]


def _read_txt(path: str, columns: list[str], report: CorpusReport) -> Iterator[Row]:
    if columns != ["text"]:
        raise CorpusError(f"{path}: plain text holds one sentence a line; pairs need JSONL/Parquet")
    for file in _files(path, (".txt",)):
        with open(file, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                where = f"{file}:{number}"
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    yield None, where, "invalid_utf8"
                    continue
                yield {"text": text}, where, None


def _read_jsonl(path: str, columns: list[str], report: CorpusReport) -> Iterator[Row]:
    for file in _files(path, (".jsonl", ".json")):
        with open(file, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                where = f"{file}:{number}"
                if not raw.strip():
                    yield None, where, "empty"
                    continue
                try:
                    record = json.loads(raw.decode("utf-8"))
                except UnicodeDecodeError:
                    yield None, where, "invalid_utf8"
                    continue
                except json.JSONDecodeError:
                    yield None, where, "invalid_json"
                    continue
                if not isinstance(record, dict):
                    yield None, where, "not_an_object"
                    continue
                missing = [c for c in columns if c not in record]
                if missing:
                    yield None, where, f"missing_field:{missing[0]}"
                    continue
                yield {c: record[c] for c in columns}, where, None


def _read_parquet(path: str, columns: list[str], report: CorpusReport) -> Iterator[Row]:
    import pyarrow.parquet as pq

    for file in _files(path, (".parquet",)):
        parquet = pq.ParquetFile(file)
        missing = [c for c in columns if c not in parquet.schema_arrow.names]
        if missing:
            raise CorpusError(
                f"{file}: no column {missing[0]!r} (columns: {parquet.schema_arrow.names})"
            )
        row = 0
        for batch in parquet.iter_batches(columns=columns, batch_size=65536):
            for record in batch.to_pylist():
                row += 1
                yield record, f"{file}:row {row}", None


def _read_hf(path: str, columns: list[str], report: CorpusReport, split: str) -> Iterator[Row]:
    import datasets

    if Path(path).exists():
        loaded = datasets.load_from_disk(path)
    else:
        name = path.removeprefix("hf://")
        loaded = datasets.load_dataset(name, split=split)
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise CorpusError(f"{path}: no split {split!r} (splits: {list(loaded)})")
        loaded = loaded[split]
    missing = [c for c in columns if c not in loaded.column_names]
    if missing:
        raise CorpusError(f"{path}: no column {missing[0]!r} (columns: {loaded.column_names})")
    for index, record in enumerate(loaded.select_columns(columns)):
        yield record, f"{path}[{split}] row {index}", None


def read_rows(
    path: str,
    fmt: str = "auto",
    columns: list[str] | None = None,
    hf_split: str = "train",
    deduplicate: bool = True,
    max_rows: int | None = None,
) -> tuple[dict[str, list[str]], CorpusReport]:
    """Clean rows of `columns` (text fields) from a corpus, plus the report of drops.

    A row is dropped (and counted) when a field is missing, not a string, invalid UTF-8,
    empty or whitespace-only, or when it repeats an earlier row exactly (after stripping).
    """
    columns = columns or ["text"]
    fmt = detect_format(path, fmt)
    report = CorpusReport()
    readers = {"txt": _read_txt, "jsonl": _read_jsonl, "parquet": _read_parquet}
    if fmt == "hf":
        rows = _read_hf(path, columns, report, hf_split)
    elif fmt in readers:
        rows = readers[fmt](path, columns, report)
    else:
        raise CorpusError(f"{path}: unknown format {fmt!r}")
    kept: dict[str, list[str]] = {c: [] for c in columns}
    seen: set[int] = set()
    for record, where, reason in rows:
        if max_rows is not None and report.kept >= max_rows:
            break
        if record is None:
            report.drop(reason, where)
            continue
        values = []
        for column in columns:
            value = record[column]
            if value is None:
                reason = "empty"
                break
            if not isinstance(value, str):
                reason = f"not_text:{column}"
                break
            value = value.strip()
            if not value:
                reason = "empty"
                break
            values.append(value)
        if reason is not None:
            report.drop(reason, where)
            continue
        if deduplicate:
            key = hash(tuple(values))
            if key in seen:
                report.dropped["duplicate"] += 1  # common and harmless: counted, not logged
                continue
            seen.add(key)
        for column, value in zip(columns, values):
            kept[column].append(value)
        report.kept += 1
    if report.kept == 0:
        raise CorpusError(f"{path}: no usable rows ({report.summary()})")
    log.info(report.summary())
    return kept, report


def corpus_columns(data_config) -> list[str]:
    if data_config.kind == "sentences":
        return [data_config.text_column]
    columns = [data_config.anchor_column, data_config.positive_column]
    if data_config.group_column:
        columns.append(data_config.group_column)
    return columns


def load_training_dataset(data_config):
    """The training corpus as a Ray Dataset plus its cleaning report."""
    import ray

    from distributed_emb.paths import shipped_corpus

    path = data_config.path or shipped_corpus("wiki_sentences.txt")
    columns = corpus_columns(data_config)
    rows, report = read_rows(
        path,
        data_config.format,
        columns,
        data_config.hf_split,
        data_config.deduplicate,
        data_config.max_rows,
    )
    table = pa.table(rows)
    if data_config.shuffle_seed is not None:
        order = np.random.default_rng(data_config.shuffle_seed).permutation(table.num_rows)
        table = table.take(pa.array(order))
    # Several blocks so the dataset can be split across workers.
    return ray.data.from_arrow(table).repartition(max(1, min(64, table.num_rows // 512))), report
