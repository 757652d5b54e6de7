"""Reading corpus files into parsed rows: one reader for every format, run by Ray Data tasks.

Every file listed by data/sources.py is read here, by its suffix, in blocks:

- ``.txt``: one text a line; LF, CRLF and CR line ends alike;
- ``.jsonl``/``.json``: one JSON object a line;
- ``.parquet`` and ``.arrow`` (a saved Hugging Face dataset): record batches;
- any of them compressed with gzip, zstd or bz2 (decompressed while streaming).

A line is never held whole beyond ``4 × max_chars`` bytes: a 10 MB line is skipped as it streams
and counted as ``too_long``. Each row leaves the reader either kept (its normalised values) or
with a drop reason and where it was (``file:line``); nothing is lost without a count.

Every row gets a stable id, ``file index << 36 | line (or row) number``: the same row has the
same id in every epoch, on every worker and in every run over the same files: what the row
log (`output.row_log`), the de-duplication's "first copy" and the shards' corpus order rely on
(data/corpus_dataset.py).

`RowRules` decides what a record means (sentence/pair corpora here, documents in
data/documents.py); the reader only turns bytes into records.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from distributed_emb.data.sources import CorpusError, CorpusFiles, SourceFile

ROW_ID = "_row_id"
DROP = "_drop"  # "" for a kept row, else the reason
WHERE = "_where"  # "file:line: detail" for a dropped row, null for a kept one
FILE_BITS = 36  # rows per file < 2**36; files < 2**27
MAX_EXAMPLES = 5
_LINE_END = re.compile(rb"\r\n|\r|\n")


def row_id(file_index: int, number: int) -> int:
    return (file_index << FILE_BITS) | number


class RowRules(Protocol):
    """What a record means: which fields to read and how a record becomes a kept row."""

    fields: list[str]  # record fields to read (Parquet/Arrow columns are pruned to these)
    required: list[str]  # fields every Parquet/Arrow file must have
    schema: pa.Schema  # the kept row's columns
    max_chars: int

    def normalise(self, record: dict) -> tuple[dict | None, str, str]:
        """(kept values, "", "") or (None, drop reason, detail)."""


@dataclass
class TextRows:
    """Sentence corpora (one text column) and pair tables (anchor, positive [, group]).

    A row is dropped when a field is missing, null, not a string, empty after stripping, or
    longer than `max_chars` characters (a character cap before tokenisation: a 10 MB "sentence"
    is a broken file, not training data). The group column may also be an integer."""

    columns: list[str]
    group_column: str | None = None
    max_chars: int = 20_000

    @property
    def fields(self) -> list[str]:
        return self.columns + ([self.group_column] if self.group_column else [])

    @property
    def required(self) -> list[str]:
        return self.fields

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([(name, pa.string()) for name in self.fields])

    def normalise(self, record: dict) -> tuple[dict | None, str, str]:
        values = {}
        for name in self.fields:
            if name not in record:
                return None, f"missing_field:{name}", ""
            value = record[name]
            if value is None:
                return None, "empty", f"{name} is null"
            if name == self.group_column and isinstance(value, int) and not isinstance(value, bool):
                value = str(value)
            if not isinstance(value, str):
                return None, f"not_text:{name}", type(value).__name__
            value = value.strip()
            if not value:
                return None, "empty", ""
            if len(value) > self.max_chars:
                return None, "too_long", f"{len(value)} characters > max_chars {self.max_chars}"
            values[name] = value
        return values, "", ""

    def normalise_arrow(self, table: pa.Table) -> tuple[pa.Table, np.ndarray, np.ndarray]:
        """`normalise` for a whole Parquet/Arrow batch at once, in Arrow compute (the per-row
        Python path costs more than reading): (kept values with nulls where dropped, reasons,
        details), the same reasons in the same order of checks as `normalise`."""
        rows = table.num_rows
        reasons = np.full(rows, "", dtype=object)
        details = np.full(rows, "", dtype=object)

        def drop(mask: np.ndarray, reason: str, detail) -> None:
            mask = mask & (reasons == "")
            reasons[mask] = reason
            details[mask] = detail if isinstance(detail, str) else detail[mask]

        columns = {}
        for name in self.fields:
            column = table.column(name)
            if name == self.group_column and pa.types.is_integer(column.type):
                column = pc.cast(column, pa.string())
            nulls = column.is_null().to_numpy(zero_copy_only=False)
            drop(nulls, "empty", f"{name} is null")
            if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
                drop(~nulls, f"not_text:{name}", str(column.type))
                columns[name] = pa.nulls(rows, pa.string())
                continue
            stripped = pc.utf8_trim_whitespace(column.cast(pa.string()))
            lengths = pc.fill_null(pc.utf8_length(stripped), 0).to_numpy(zero_copy_only=False)
            drop(~nulls & (lengths == 0), "empty", "")
            too_long = lengths > self.max_chars
            if too_long.any():
                drop(too_long, "too_long", np.array(
                    [f"{n} characters > max_chars {self.max_chars}" for n in lengths], object
                ))  # fmt: skip
            columns[name] = stripped
        kept = pa.array(reasons == "")
        values = pa.table(
            {
                name: pc.if_else(kept, columns[name], pa.scalar(None, pa.string()))
                for name in self.fields
            }  # fmt: skip
        )
        return values, reasons, details


@dataclass
class DropReport:
    """What reading kept and dropped, by reason, with the first few places of each reason.

    Counted per block where the block is read and merged exactly (`merge`), so the totals are
    the same however the corpus is cut into blocks."""

    rows: int = 0
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)  # e.g. blank_sentences_removed

    def drop(self, reason: str, where: str, count: int = 1) -> None:
        self.rows += count
        self.dropped[reason] = self.dropped.get(reason, 0) + count
        examples = self.examples.setdefault(reason, [])
        if where and len(examples) < MAX_EXAMPLES:
            examples.append(where)

    def merge(self, other: DropReport) -> None:
        self.rows += other.rows
        self.kept += other.kept
        for reason, count in other.dropped.items():
            self.dropped[reason] = self.dropped.get(reason, 0) + count
            examples = self.examples.setdefault(reason, [])
            examples.extend(other.examples.get(reason, [])[: MAX_EXAMPLES - len(examples)])
        for name, count in other.counters.items():
            self.counters[name] = self.counters.get(name, 0) + count

    @property
    def total(self) -> int:
        return self.rows

    @property
    def blank_sentences_removed(self) -> int:
        return self.counters.get("blank_sentences_removed", 0)

    def as_dict(self) -> dict:
        return {
            "read": self.rows,
            "kept": self.kept,
            "dropped": dict(sorted(self.dropped.items())),
            "examples": {k: list(v) for k, v in sorted(self.examples.items())},
            **({"counters": dict(self.counters)} if self.counters else {}),
        }

    @classmethod
    def from_dict(cls, tree: dict) -> DropReport:
        return cls(
            tree["read"], tree["kept"], dict(tree["dropped"]), dict(tree["examples"]),
            dict(tree.get("counters", {})),
        )  # fmt: skip

    def summary(self, what: str = "corpus") -> str:
        parts = ", ".join(f"{k}={v}" for k, v in sorted(self.dropped.items())) or "none"
        lines = [f"{what}: read {self.rows} rows, kept {self.kept}, dropped: {parts}"]
        for reason, wheres in sorted(self.examples.items()):
            lines.extend(f"  {reason}: {where}" for where in wheres)
        return "\n".join(lines)

    @classmethod
    def of_block(cls, table: pa.Table) -> DropReport:
        """The counts of one parsed block (a table with DROP and WHERE columns)."""
        report = cls()
        reasons = table.column(DROP).to_pylist()
        wheres = table.column(WHERE).to_pylist()
        for reason, where in zip(reasons, wheres):
            if reason:
                report.drop(reason, where)
            else:
                report.rows += 1
                report.kept += 1
        if "_blank_sentences" in table.column_names:
            blank = pc.sum(table.column("_blank_sentences")).as_py() or 0
            if blank:
                report.counters["blank_sentences_removed"] = blank
        return report


# ---------------------------------------------------------------------------------------------
# Bytes → records
# ---------------------------------------------------------------------------------------------

TOO_LONG = object()  # stands for a line that was skipped while streaming


def iter_lines(read: Any, max_line_bytes: int, chunk_bytes: int = 1 << 20) -> Iterator[Any]:
    """Lines of a binary stream without their ends (LF, CRLF or CR), as bytes; a line longer
    than `max_line_bytes` is skipped as it streams and yields TOO_LONG in its place."""
    pending = b""
    skipping = False
    while True:
        chunk = read(chunk_bytes)
        at_end = not chunk
        pending += chunk
        position = 0
        for end in _LINE_END.finditer(pending):
            # A CR at the very end of a chunk may be the first half of a CRLF: wait for more.
            if end.group() == b"\r" and end.end() == len(pending) and not at_end:
                break
            line = pending[position : end.start()]
            position = end.end()
            if skipping:
                skipping = False
                continue  # the rest of a too-long line, already reported
            yield TOO_LONG if len(line) > max_line_bytes else line
        pending = pending[position:]
        if not skipping and len(pending) > max_line_bytes:
            skipping = True
            yield TOO_LONG
        if skipping:
            pending = pending[-1:] if pending.endswith(b"\r") else b""
        if at_end:
            if pending and not skipping:
                yield pending
            return


def _line_records(lines: Iterable[Any], file: SourceFile, text_field: str | None, first: int = 1):
    """(number, record | None, reason, detail) for each line of a txt or jsonl file, the first
    numbered `first`."""
    for number, raw in enumerate(lines, start=first):
        if raw is TOO_LONG:
            yield number, None, "too_long", "line longer than the max_chars cap"
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            yield number, None, "invalid_utf8", str(error)
            continue
        if file.format == "txt":
            if text_field is None:
                raise CorpusError(
                    f"{file.path}: plain text holds one text a line; pairs and documents need "
                    "JSONL, Parquet or Arrow"
                )
            yield number, {text_field: line}, "", ""
            continue
        if not line.strip():
            yield number, None, "blank_line", ""
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            yield number, None, "invalid_json", error.msg
            continue
        if not isinstance(record, dict):
            yield number, None, "not_an_object", f"got {type(record).__name__}"
            continue
        yield number, record, "", ""


def _table_records(batches: Iterable[pa.Table], file: SourceFile, rules: RowRules, first: int = 1):
    number = first - 1
    for batch in batches:
        missing = [name for name in rules.required if name not in batch.schema.names]
        if missing:
            raise CorpusError(
                f"{file.path}: no column {missing[0]!r} (columns: {batch.schema.names})"
            )
        wanted = [name for name in rules.fields if name in batch.schema.names]
        for record in batch.select(wanted).to_pylist():
            number += 1
            yield number, record, "", ""


def _open(filesystem: pafs.FileSystem, file: SourceFile):
    if file.format in ("parquet", "arrow") and file.compression is None:
        return filesystem.open_input_file(file.path)  # random access: Parquet reads its footer
    return filesystem.open_input_stream(file.path, compression=file.compression)


def _parquet(handle, file: SourceFile) -> pq.ParquetFile:
    return pq.ParquetFile(handle if file.compression is None else pa.BufferReader(handle.read()))


def _checked_columns(names: list[str], file: SourceFile, rules: RowRules) -> list[str]:
    present = [name for name in rules.fields if name in names]
    missing = [name for name in rules.required if name not in present]
    if missing:
        raise CorpusError(f"{file.path}: no column {missing[0]!r} (columns: {names})")
    return present


def exact_blocks(batches, block_rows: int) -> Iterator[pa.Table]:
    """Record batches of any sizes → tables of exactly `block_rows` rows (the last may be
    shorter)."""
    pending: list[pa.Table] = []
    pending_rows = 0
    for batch in batches:
        table = pa.Table.from_batches([batch])
        pending.append(table)
        pending_rows += table.num_rows
        while pending_rows >= block_rows:
            merged = pa.concat_tables(pending)
            yield merged.slice(0, block_rows)
            rest = merged.slice(block_rows)
            pending, pending_rows = [rest], rest.num_rows
    if pending_rows:
        yield pa.concat_tables(pending)


def _table_blocks(handle, file: SourceFile, rules: RowRules, block_rows: int) -> Iterator[pa.Table]:
    """A Parquet or Arrow file's wanted columns in `block_rows`-row tables."""
    if file.format == "parquet":
        parquet = _parquet(handle, file)
        columns = _checked_columns(parquet.schema_arrow.names, file, rules)
        batches = parquet.iter_batches(batch_size=block_rows, columns=columns)
        yield from exact_blocks(batches, block_rows)
        return
    yield from exact_blocks(pa.ipc.open_stream(handle), block_rows)


def _vectorised_blocks(tables, file: SourceFile, rules, first: int) -> Iterator[pa.Table]:
    """Parquet/Arrow tables → parsed blocks without a Python loop over rows; rows numbered
    from `first`."""
    for part in tables:
        missing = [name for name in rules.required if name not in part.column_names]
        if missing:
            raise CorpusError(
                f"{file.path}: no column {missing[0]!r} (columns: {part.column_names})"
            )
        values, reasons, details = rules.normalise_arrow(part)
        numbers = np.arange(first, first + part.num_rows, dtype=np.int64)
        first += part.num_rows
        dropped = np.flatnonzero(reasons != "")
        wheres = np.full(part.num_rows, None, dtype=object)
        for index in dropped:
            where = f"{file.path}:row {numbers[index]}"
            wheres[index] = f"{where}: {details[index]}" if details[index] else where
        yield (
            values.append_column(ROW_ID, pa.array((file.index << FILE_BITS) | numbers))
            .append_column(DROP, pa.array(reasons.astype(str)))
            .append_column(WHERE, pa.array(wheres, pa.string()))
        )


def read_file_blocks(
    filesystem: pafs.FileSystem,
    file: SourceFile,
    rules: RowRules,
    block_rows: int = 10_000,
) -> Iterator[pa.Table]:
    """Parsed blocks of one file (below); a file its reader cannot parse at all (a ".parquet"
    that is not Parquet, a ".gz" cut short) is a CorpusError naming it, wherever it is read."""
    try:
        yield from _parsed_file_blocks(filesystem, file, rules, block_rows)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        raise CorpusError(f"{file.path}: not a readable {file.format} file ({error})") from None
    except OSError as error:
        failure = _inflate_failure(file, error)
        if failure is None:
            raise  # the filesystem's own errors name the file already
        raise failure from None


# Arrow's codecs' words for bytes that do not decompress ("zlib inflate failed: ...", "ZSTD
# decompress failed: ...", "Truncated compressed stream"); its filesystems' errors use neither.
_CODEC_FAILURE = re.compile(r"inflate|decompress|compressed stream", re.IGNORECASE)


def _inflate_failure(file: SourceFile, error: OSError, reached: str = "") -> CorpusError | None:
    """The CorpusError for a compressed file whose bytes do not inflate (truncated or corrupt),
    naming it and the last line or row read whole (`reached`, when known); None for any other
    OSError. Arrow's codec errors name neither the file nor the place."""
    if file.compression is None or not _CODEC_FAILURE.search(str(error)):
        return None
    after = f" after {reached}" if reached else ""
    detail = " ".join(str(error).split())
    return CorpusError(f"{file.path}: failed to inflate {file.compression}{after}: {detail}")


def _parsed_file_blocks(
    filesystem: pafs.FileSystem,
    file: SourceFile,
    rules: RowRules,
    block_rows: int,
) -> Iterator[pa.Table]:
    """Parsed blocks of one file: the kept columns of `rules` plus ROW_ID, DROP and WHERE.

    Block b is the file's lines or rows [b·block_rows, (b+1)·block_rows): the file alone
    fixes it, so it is the same rows in every read.
    """
    text_field = rules.fields[0] if len(rules.fields) == 1 else None
    with _open(filesystem, file) as handle:
        if file.format in ("parquet", "arrow") and hasattr(rules, "normalise_arrow"):
            tables = _table_blocks(handle, file, rules, block_rows)
            yield from _vectorised_blocks(tables, file, rules, 1)
            return
        if file.format in ("txt", "jsonl"):
            records = _line_records(
                iter_lines(handle.read, 4 * rules.max_chars + 4), file, text_field
            )
            label = ""
        else:
            records = _table_records(_table_blocks(handle, file, rules, block_rows), file, rules)
            label = "row "
        rows: list[tuple[int, dict | None, str, str]] = []
        number = None
        try:
            for number, record, reason, detail in records:
                if record is not None:
                    values, reason, detail = rules.normalise(record)
                    record = values
                rows.append((number, record, reason, detail))
                if len(rows) >= block_rows:
                    yield _block(rows, file, rules, label)
                    rows = []
        except OSError as error:
            # Only here is the last line or row read known; read_file_blocks names the rest.
            reached = "" if number is None else f"{label or 'line '}{number}"
            failure = _inflate_failure(file, error, reached)
            if failure is None:
                raise
            raise failure from None
        if rows:
            yield _block(rows, file, rules, label)


def _block(rows: list, file: SourceFile, rules: RowRules, label: str) -> pa.Table:
    columns: dict[str, list] = {name: [] for name in rules.schema.names}
    ids, drops, wheres = [], [], []
    for number, values, reason, detail in rows:
        ids.append(row_id(file.index, number))
        drops.append(reason)
        where = f"{file.path}:{label}{number}"
        wheres.append(None if not reason else f"{where}: {detail}" if detail else where)
        for name in columns:
            columns[name].append(None if values is None else values.get(name))
    schema = rules.schema.append(pa.field(ROW_ID, pa.int64()))
    schema = schema.append(pa.field(DROP, pa.string())).append(pa.field(WHERE, pa.string()))
    return pa.Table.from_pydict({**columns, ROW_ID: ids, DROP: drops, WHERE: wheres}, schema=schema)


def iter_parsed_blocks(files: CorpusFiles, rules: RowRules, block_rows: int = 10_000):
    """Every parsed block of every file, in file order, in this process (no Ray): the local
    reference path for tests, small inputs and tools."""
    for file, filesystem in zip(files.files, files.filesystems):
        yield from read_file_blocks(filesystem, file, rules, block_rows)


# ---------------------------------------------------------------------------------------------
# Ray Data
# ---------------------------------------------------------------------------------------------


def corpus_datasource(files: CorpusFiles, rules: RowRules, block_rows: int = 10_000):
    """A Ray Data datasource with one read task per file, in the files' order: the files are
    opened and parsed on the cluster, never on the driver (data/corpus_dataset.py)."""
    from ray.data.block import BlockMetadata  # startup
    from ray.data.datasource import Datasource, ReadTask  # startup

    class CorpusDatasource(Datasource):
        def estimate_inmemory_data_size(self) -> int | None:
            return files.total_bytes or None

        def get_read_tasks(self, parallelism, per_task_row_limit=None, data_context=None):
            tasks = []
            for file, filesystem in zip(files.files, files.filesystems):
                metadata = BlockMetadata(
                    num_rows=None, size_bytes=file.size, input_files=[file.path], exec_stats=None
                )

                def read(file=file, filesystem=filesystem):
                    yield from read_file_blocks(filesystem, file, rules, block_rows)

                tasks.append(ReadTask(read, metadata, per_task_row_limit=per_task_row_limit))
            return tasks

        def get_name(self) -> str:
            return "Corpus"

    return CorpusDatasource()
