"""Document corpora → a Ray Dataset of ``{doc_id: str, sentences: list[str]}``.

Sources (one or several, possibly of different formats; their rows are unioned):

- JSONL: one object per line, ``{"id": ..., "sentences": [...]}`` or ``{"id": ..., "text": ...}``.
  Read by a streaming Ray datasource that keeps line numbers, so a bad line is reported as
  ``corpus.jsonl:17: invalid JSON (...)``.
- Parquet: a file or a directory of files with the same columns.
- Hugging Face datasets: a directory written by ``Dataset.save_to_disk`` (``load_from_disk``)
  or, when online, a hub name (``load_dataset(name, split=...)``).

Column names are configurable (:class:`DocumentColumns`). When a row has both a sentences list
and a text, the sentences list wins. Text is split by :func:`split_sentences`.

Bad rows are skipped and counted by reason (see ``DROP_REASONS``), never silently: the counts
and a few examples naming file and line come back in a :class:`ReadReport` and are logged.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from distributed_emb.paths import shipped_corpus

logger = logging.getLogger(__name__)

SourceFormat = Literal["auto", "jsonl", "parquet", "hf_disk", "hf_hub"]

DROP_REASONS = {
    "blank_line": "blank line in a JSONL file",
    "invalid_utf8": "line is not valid UTF-8",
    "invalid_json": "line is not valid JSON",
    "not_an_object": "JSON value is not an object",
    "missing_id": "no id (missing, null or empty)",
    "bad_id": "id is neither a string nor an integer",
    "empty_text": "no sentences and no text, or only whitespace",
    "sentences_not_list": "the sentences field is not a list",
    "sentence_not_string": "a sentence in the list is not a string",
    "text_not_string": "the text field is not a string",
    "too_few_sentences": "fewer sentences than min_sentences (default 2: one sentence has no "
    "intra-document positive)",
}

# Parsed rows carry their fate with them, so one pass both parses and counts.
_PARSED_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("sentences", pa.list_(pa.string())),
        ("drop_reason", pa.string()),  # "" for kept rows
        ("where", pa.string()),  # file:line, or file and id, for the report
        ("blank_sentences", pa.int64()),  # whitespace-only entries removed from a kept list
    ]
)
DOCUMENT_SCHEMA = pa.schema([("doc_id", pa.string()), ("sentences", pa.list_(pa.string()))])


# ---------------------------------------------------------------------------------------------
# Sentence splitting
# ---------------------------------------------------------------------------------------------

_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
# Sentence-final punctuation (with any closing quotes/brackets), whitespace, then a capital
# letter, possibly behind an opening quote or bracket.
_BOUNDARY = re.compile(r"""([.!?]+["'”’)\]]*)\s+(?=["'“‘(\[]?[A-Z])""")
_TITLES = {
    "mr", "mrs", "ms", "dr", "prof", "st", "jr", "sr", "mt", "gen", "col", "lt", "sgt",
    "capt", "rev", "hon", "vs",
}  # fmt: skip
_LAST_WORD = re.compile(r"(\w+)$")


def _ends_with_abbreviation(prefix: str) -> bool:
    match = _LAST_WORD.search(prefix)
    if match is None:
        return False
    word = match.group(1)
    return word.lower() in _TITLES or (len(word) == 1 and word.isupper())


def split_sentences(text: str) -> list[str]:
    """Split `text` into sentences with a simple, deterministic rule (no model, no download).

    - Blank lines (paragraph breaks) always end a sentence; other whitespace is collapsed.
    - Inside a paragraph, a sentence ends at ``.``, ``!`` or ``?`` (plus closing quotes or
      brackets) followed by whitespace and a capital letter (optionally after an opening quote).
    - No split after a period that follows a title (Mr., Dr., St., ...) or a single capital
      letter (initials: "J. R. R. Tolkien").

    Known limits: other abbreviations before a capital ("U.S. Army", "Apple Inc. The") and
    sentences starting with a digit or lower case are mis-split. Give a ``sentences`` list when
    the corpus is already split.
    """
    sentences: list[str] = []
    for paragraph in _PARAGRAPH_BREAK.split(text):
        paragraph = " ".join(paragraph.split())
        start = 0
        for boundary in _BOUNDARY.finditer(paragraph):
            end_punctuation = boundary.group(1)
            if end_punctuation.startswith(".") and _ends_with_abbreviation(
                paragraph[: boundary.start(1)]
            ):
                continue
            sentences.append(paragraph[start : boundary.end(1)])
            start = boundary.end()
        tail = paragraph[start:].strip()
        if tail:
            sentences.append(tail)
    return sentences


# ---------------------------------------------------------------------------------------------
# Row normalisation (shared by every format, in Ray and in the local reader)
# ---------------------------------------------------------------------------------------------


@dataclass
class DocumentColumns:
    """Names of the input columns/keys."""

    id: str = "id"
    sentences: str = "sentences"
    text: str = "text"


@dataclass
class ParsedRow:
    doc_id: str
    sentences: list[str]
    drop_reason: str  # "" when kept
    where: str
    blank_sentences: int = 0


def _dropped(reason: str, where: str, detail: str = "") -> ParsedRow:
    return ParsedRow("", [], reason, f"{where}: {detail}" if detail else where)


def normalise_record(
    record: Any, columns: DocumentColumns, min_sentences: int, where: str
) -> ParsedRow:
    """One input record (a mapping) → a kept document or a drop reason."""
    if not isinstance(record, Mapping):
        return _dropped("not_an_object", where, f"got {type(record).__name__}")

    raw_id = record.get(columns.id)
    if isinstance(raw_id, bool) or (raw_id is not None and not isinstance(raw_id, (str, int))):
        return _dropped("bad_id", where, f"id {raw_id!r}")
    doc_id = str(raw_id).strip() if raw_id is not None else ""
    if not doc_id:
        return _dropped("missing_id", where)
    where = f"{where} (id {doc_id})"

    raw_sentences = record.get(columns.sentences)
    raw_text = record.get(columns.text)
    if raw_sentences is not None:
        if not isinstance(raw_sentences, (list, tuple)):
            return _dropped("sentences_not_list", where, type(raw_sentences).__name__)
        if not all(isinstance(s, str) for s in raw_sentences):
            return _dropped("sentence_not_string", where)
        stripped = [" ".join(s.split()) for s in raw_sentences]
        sentences = [s for s in stripped if s]
        blank = len(stripped) - len(sentences)
    elif raw_text is not None:
        if not isinstance(raw_text, str):
            return _dropped("text_not_string", where, type(raw_text).__name__)
        sentences, blank = split_sentences(raw_text), 0
    else:
        sentences, blank = [], 0

    if not sentences:
        return _dropped("empty_text", where)
    if len(sentences) < min_sentences:
        return _dropped("too_few_sentences", where, f"{len(sentences)} sentence(s)")
    return ParsedRow(doc_id, sentences, "", where, blank)


def _parsed_table(rows: list[ParsedRow]) -> pa.Table:
    return pa.Table.from_pydict(
        {
            "doc_id": [r.doc_id for r in rows],
            "sentences": [r.sentences for r in rows],
            "drop_reason": [r.drop_reason for r in rows],
            "where": [r.where for r in rows],
            "blank_sentences": [r.blank_sentences for r in rows],
        },
        schema=_PARSED_SCHEMA,
    )


def iter_jsonl_records(
    lines: Iterable[bytes], path: str, columns: DocumentColumns, min_sentences: int
) -> Iterator[ParsedRow]:
    """Parse JSONL lines (bytes, without or with the newline), numbering them from 1."""
    for line_number, raw in enumerate(lines, start=1):
        where = f"{path}:{line_number}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            yield _dropped("invalid_utf8", where, str(error))
            continue
        if not line.strip():
            yield _dropped("blank_line", where)
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            yield _dropped("invalid_json", where, error.msg)
            continue
        yield normalise_record(record, columns, min_sentences, where)


def _iter_file_lines(read_chunk, chunk_bytes: int = 8 << 20) -> Iterator[bytes]:
    """Lines of a binary stream read in chunks (a multi-GB file never sits in memory whole)."""
    pending = b""
    while True:
        chunk = read_chunk(chunk_bytes)
        if not chunk:
            break
        pending += chunk
        *complete, pending = pending.split(b"\n")
        yield from complete
    if pending:
        yield pending


def _normalise_table(
    table: pa.Table, columns: DocumentColumns, min_sentences: int, source: str
) -> pa.Table:
    """A batch of Parquet / HF rows → parsed rows (Ray `map_batches`, pyarrow format)."""
    names = set(table.column_names)
    paths = table.column("path").to_pylist() if "path" in names else [source] * table.num_rows
    wanted = [c for c in (columns.id, columns.sentences, columns.text) if c in names]
    records = table.select(wanted).to_pylist()
    rows = [
        normalise_record(record, columns, min_sentences, path)
        for record, path in zip(records, paths, strict=True)
    ]
    return _parsed_table(rows)


# ---------------------------------------------------------------------------------------------
# Ray: the JSONL datasource and the reader
# ---------------------------------------------------------------------------------------------


def _jsonl_datasource(paths: list[str], columns: DocumentColumns, min_sentences: int):
    from ray.data.datasource import FileBasedDatasource

    class JsonlDocumentDatasource(FileBasedDatasource):
        """Streams JSONL files line by line, keeping line numbers for the drop report."""

        def __init__(self, block_rows: int = 1000):
            super().__init__(paths, file_extensions=["jsonl", "json"])
            self.block_rows = block_rows

        def _read_stream(self, f, path: str):
            rows: list[ParsedRow] = []
            for row in iter_jsonl_records(_iter_file_lines(f.read), path, columns, min_sentences):
                rows.append(row)
                if len(rows) >= self.block_rows:
                    yield _parsed_table(rows)
                    rows = []
            if rows:
                yield _parsed_table(rows)

    return JsonlDocumentDatasource()


def _has_hf_dataset(directory: Path) -> bool:
    return any(
        (directory / name).is_file()
        for name in ("dataset_info.json", "state.json", "dataset_dict.json")
    )


def detect_format(source: str) -> str:
    """jsonl | parquet | hf_disk | hf_hub for one source path or hub name."""
    path = Path(source)
    if path.is_file():
        if path.suffix in (".jsonl", ".json"):
            return "jsonl"
        if path.suffix == ".parquet":
            return "parquet"
        raise ValueError(f"{source}: cannot tell the format from the suffix {path.suffix!r}")
    if path.is_dir():
        if _has_hf_dataset(path):
            return "hf_disk"
        if any(path.rglob("*.parquet")):
            return "parquet"
        if any(path.rglob("*.jsonl")) or any(path.rglob("*.json")):
            return "jsonl"
        raise ValueError(f"{source}: directory holds no .jsonl, .parquet or saved HF dataset")
    if source.count("/") <= 1 and not source.startswith((".", "/", "~")) and not path.suffix:
        return "hf_hub"  # "owner/name" or "name": a Hugging Face hub dataset
    raise FileNotFoundError(f"document source {source} does not exist")


def _load_hf(source: str, source_format: str, split: str):
    import datasets

    if source_format == "hf_hub":
        return datasets.load_dataset(source, split=split)
    loaded = datasets.load_from_disk(source)
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise ValueError(f"{source}: no split {split!r}; splits are {sorted(loaded)}")
        return loaded[split]
    return loaded


@dataclass
class DocumentsConfig:
    """Where documents come from and how their columns are named (a config section)."""

    paths: list[str] = field(
        default_factory=lambda: [
            shipped_corpus("lee_documents.jsonl"),
            shipped_corpus("wiki_documents.jsonl"),
        ]
    )
    format: SourceFormat = "auto"
    id_column: str = "id"
    sentences_column: str = "sentences"
    text_column: str = "text"
    hf_split: str = "train"
    min_sentences: int = 2

    def validate(self) -> None:
        if not self.paths:
            raise ValueError("documents.paths is empty")
        if self.min_sentences < 1:
            raise ValueError(f"documents.min_sentences must be ≥ 1, got {self.min_sentences}")

    @property
    def columns(self) -> DocumentColumns:
        return DocumentColumns(self.id_column, self.sentences_column, self.text_column)


@dataclass
class ReadReport:
    """What reading kept and dropped, by reason, with a few located examples per reason."""

    rows: int = 0
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)
    blank_sentences_removed: int = 0

    def add(self, row: ParsedRow, max_examples: int = 5) -> None:
        self.rows += 1
        self.blank_sentences_removed += row.blank_sentences
        if not row.drop_reason:
            self.kept += 1
            return
        self.dropped[row.drop_reason] = self.dropped.get(row.drop_reason, 0) + 1
        examples = self.examples.setdefault(row.drop_reason, [])
        if len(examples) < max_examples:
            examples.append(row.where)

    def summary(self) -> str:
        lines = [f"documents: read {self.rows} rows, kept {self.kept}"]
        for reason, count in sorted(self.dropped.items()):
            lines.append(f"  skipped {count} ({DROP_REASONS.get(reason, reason)}), e.g.:")
            lines.extend(f"    {where}" for where in self.examples.get(reason, []))
        if self.blank_sentences_removed:
            lines.append(
                f"  removed {self.blank_sentences_removed} blank sentences from kept documents"
            )
        return "\n".join(lines)

    def log(self) -> None:
        (logger.warning if self.dropped else logger.info)(self.summary())


@dataclass
class DocumentCorpus:
    dataset: Any  # ray.data.MaterializedDataset of {doc_id, sentences}
    report: ReadReport


def _summarise_parsed(table: pa.Table, max_examples: int) -> pa.Table:
    """Per-batch counts by reason (+ examples), so the driver never pulls the documents."""
    report = ReadReport()
    for reason, where, blank in zip(
        table.column("drop_reason").to_pylist(),
        table.column("where").to_pylist(),
        table.column("blank_sentences").to_pylist(),
        strict=True,
    ):
        report.add(ParsedRow("", [], reason, where, blank), max_examples)
    reasons = ["", *report.dropped]
    return pa.table(
        {
            "reason": reasons,
            "count": [report.kept, *report.dropped.values()],
            "examples": [[], *(report.examples[r] for r in report.dropped)],
            "blank_sentences": [report.blank_sentences_removed] + [0] * len(report.dropped),
        },
        schema=pa.schema(
            [
                ("reason", pa.string()),
                ("count", pa.int64()),
                ("examples", pa.list_(pa.string())),
                ("blank_sentences", pa.int64()),
            ]
        ),
    )


def _keep_documents(table: pa.Table) -> pa.Table:
    kept = table.filter(pc.equal(table.column("drop_reason"), ""))
    return kept.select(["doc_id", "sentences"]).cast(DOCUMENT_SCHEMA)


def _read_parsed(source: str, source_format: str, config: DocumentsConfig):
    """One source → a lazy Ray Dataset of parsed rows."""
    import ray

    columns = config.columns
    if source_format == "jsonl":
        return ray.data.read_datasource(_jsonl_datasource([source], columns, config.min_sentences))
    if source_format == "parquet":
        raw = ray.data.read_parquet(source, include_paths=True)
    else:
        raw = ray.data.from_huggingface(_load_hf(source, source_format, config.hf_split))
    return raw.map_batches(
        _normalise_table,
        batch_format="pyarrow",
        fn_kwargs={"columns": columns, "min_sentences": config.min_sentences, "source": source},
    )


def read_documents(
    config: DocumentsConfig | None = None, max_examples: int = 5, log: bool = True
) -> DocumentCorpus:
    """Read every source of `config` into one materialised Ray Dataset ``{doc_id, sentences}``.

    Materialised on purpose: the drop counts are known before anything uses the documents, and
    InfoCSE's rounds re-annotate the same documents without parsing them again.
    """
    config = config or DocumentsConfig()
    config.validate()
    parsed = None
    for source in config.paths:
        source_format = detect_format(source) if config.format == "auto" else config.format
        one = _read_parsed(source, source_format, config)
        parsed = one if parsed is None else parsed.union(one)
    parsed = parsed.materialize()

    report = ReadReport()
    for part in parsed.map_batches(
        _summarise_parsed, batch_format="pyarrow", fn_kwargs={"max_examples": max_examples}
    ).iter_rows():
        count = int(part["count"])
        report.rows += count
        report.blank_sentences_removed += int(part["blank_sentences"])
        if not part["reason"]:
            report.kept += count
            continue
        report.dropped[part["reason"]] = report.dropped.get(part["reason"], 0) + count
        examples = report.examples.setdefault(part["reason"], [])
        examples.extend(list(part["examples"])[: max_examples - len(examples)])

    documents = parsed.map_batches(_keep_documents, batch_format="pyarrow").materialize()
    del parsed  # frees the parsed rows' blocks; only the kept documents stay in the store
    if log:
        report.log()
    return DocumentCorpus(documents, report)


def read_documents_locally(
    config: DocumentsConfig | None = None, max_examples: int = 5, log: bool = True
) -> tuple[list[dict], ReadReport]:
    """The same rows without Ray, in file order: for references, tests and small corpora."""
    config = config or DocumentsConfig()
    config.validate()
    columns, report, documents = config.columns, ReadReport(), []

    def rows_of(source: str, source_format: str) -> Iterator[ParsedRow]:
        if source_format == "jsonl":
            files = [Path(source)] if Path(source).is_file() else sorted(Path(source).rglob("*"))
            for path in (p for p in files if p.suffix in (".jsonl", ".json")):
                with open(path, "rb") as handle:
                    yield from iter_jsonl_records(
                        _iter_file_lines(handle.read), str(path), columns, config.min_sentences
                    )
        elif source_format == "parquet":
            import pyarrow.parquet as pq

            files = [Path(source)] if Path(source).is_file() else sorted(Path(source).rglob("*"))
            for path in (p for p in files if p.suffix == ".parquet"):
                for record in pq.read_table(path).to_pylist():
                    yield normalise_record(record, columns, config.min_sentences, str(path))
        else:
            for record in _load_hf(source, source_format, config.hf_split):
                yield normalise_record(record, columns, config.min_sentences, source)

    for source in config.paths:
        source_format = detect_format(source) if config.format == "auto" else config.format
        for row in rows_of(source, source_format):
            report.add(row, max_examples)
            if not row.drop_reason:
                documents.append({"doc_id": row.doc_id, "sentences": row.sentences})
    if log:
        report.log()
    return documents, report
