"""Document corpora → a Ray Dataset of ``{doc_id: str, sentences: list[str]}``.

Sources are anything data/sources.py resolves (files, directories, globs, s3://, gs://, saved
or hub HF datasets), read by data/readers.py like every other corpus: one object a line in
JSONL, ``{"id": ..., "sentences": [...]}`` or ``{"id": ..., "text": ...}``, or the same columns
in Parquet/Arrow. A bad line is reported as ``corpus.jsonl:17: Expecting value``.

Column names are configurable (:class:`DocumentColumns`). When a row has both a sentences list
and a text, the sentences list wins. Text is split by :func:`split_sentences`.

Bad rows are skipped and counted by reason (see ``DROP_REASONS``), never silently: the counts
and a few examples naming file and line come back in a :class:`DropReport` and are logged.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import pyarrow as pa
import pyarrow.compute as pc
import ray
from pydantic import Field

from distributed_emb.checks import ConfigError
from distributed_emb.data.corpus import (
    KeepCleanRows,
    collect_report,
    listed_and_small,
    start_drop_counter,
)
from distributed_emb.data.readers import DROP, DropReport, corpus_datasource, iter_parsed_blocks
from distributed_emb.data.sources import resolve_sources
from distributed_emb.paths import shipped_corpus
from distributed_emb.settings import section

logger = logging.getLogger(__name__)

DROP_REASONS = {
    "blank_line": "blank line in a JSONL file",
    "too_long": "line or text longer than max_chars",
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
# Row normalisation
# ---------------------------------------------------------------------------------------------


@dataclass
class DocumentColumns:
    """Names of the input columns/keys."""

    id: str = "id"
    sentences: str = "sentences"
    text: str = "text"


def normalise_record(
    record: Any, columns: DocumentColumns, min_sentences: int
) -> tuple[dict | None, str, str]:
    """One input record → ({doc_id, sentences, _blank_sentences}, "", "") or (None, reason,
    detail)."""
    if not isinstance(record, Mapping):
        return None, "not_an_object", f"got {type(record).__name__}"

    raw_id = record.get(columns.id)
    if isinstance(raw_id, bool) or (raw_id is not None and not isinstance(raw_id, (str, int))):
        return None, "bad_id", f"id {raw_id!r}"
    doc_id = str(raw_id).strip() if raw_id is not None else ""
    if not doc_id:
        return None, "missing_id", ""

    raw_sentences = record.get(columns.sentences)
    raw_text = record.get(columns.text)
    if raw_sentences is not None:
        if not isinstance(raw_sentences, (list, tuple)):
            return None, "sentences_not_list", f"(id {doc_id}) {type(raw_sentences).__name__}"
        if not all(isinstance(s, str) for s in raw_sentences):
            return None, "sentence_not_string", f"(id {doc_id})"
        stripped = [" ".join(s.split()) for s in raw_sentences]
        sentences = [s for s in stripped if s]
        blank = len(stripped) - len(sentences)
    elif raw_text is not None:
        if not isinstance(raw_text, str):
            return None, "text_not_string", f"(id {doc_id}) {type(raw_text).__name__}"
        sentences, blank = split_sentences(raw_text), 0
    else:
        sentences, blank = [], 0

    if not sentences:
        return None, "empty_text", f"(id {doc_id})"
    if len(sentences) < min_sentences:
        return None, "too_few_sentences", f"(id {doc_id}) {len(sentences)} sentence(s)"
    return {"doc_id": doc_id, "sentences": sentences, "_blank_sentences": blank}, "", ""


@dataclass
class DocumentRows:
    """The reader's rules for document corpora (data/readers.py RowRules)."""

    columns: DocumentColumns
    min_sentences: int
    max_chars: int = 10_000_000  # a document's JSON line; only a broken file is longer

    @property
    def fields(self) -> list[str]:
        return [self.columns.id, self.columns.sentences, self.columns.text]

    @property
    def required(self) -> list[str]:
        return [self.columns.id]

    @property
    def schema(self) -> pa.Schema:
        return pa.schema(
            [
                ("doc_id", pa.string()),
                ("sentences", pa.list_(pa.string())),
                ("_blank_sentences", pa.int64()),
            ]
        )

    def normalise(self, record: dict) -> tuple[dict | None, str, str]:
        text = record.get(self.columns.text)
        if isinstance(text, str) and len(text) > self.max_chars:
            return None, "too_long", f"{len(text)} characters > max_chars {self.max_chars}"
        return normalise_record(record, self.columns, self.min_sentences)


@section
class DocumentsConfig:
    """Where documents come from and how their columns are named (a config section)."""

    paths: Annotated[
        list[str],
        Field(
            description="the document corpora: files (.jsonl/.json .parquet .arrow, "
            "optionally compressed), directories, globs, s3:// or gs:// URIs, saved Hugging "
            "Face datasets or hub names (org/name). InfoCSE: the shipped Lee and Wikipedia "
            "documents by default. A training job: none by default (it trains on data.path); "
            "given, it trains on the sentences of all but the held-out documents (heldout.*) "
            "and chooses on the held-out ones (docs/EVALUATION.md, 'Two yardsticks')"
        ),
    ] = field(
        default_factory=lambda: [
            shipped_corpus("lee_documents.jsonl"),
            shipped_corpus("wiki_documents.jsonl"),
        ]
    )
    id_column: Annotated[str, Field(description="the document id field")] = "id"
    sentences_column: Annotated[
        str,
        Field(description="the field holding a document's list of sentences (used when present)"),
    ] = "sentences"
    text_column: Annotated[
        str,
        Field(
            description="the field holding a document's text, split into sentences when it "
            "has no sentences list"
        ),
    ] = "text"
    hf_split: Annotated[str, Field(description="the split of a Hugging Face dataset")] = "train"
    # Default 2: a one-sentence document has no intra-document positive.
    min_sentences: Annotated[
        int,
        Field(ge=1, description="documents with fewer sentences are dropped and counted"),
    ] = 2
    # Only a broken file is longer.
    max_chars: Annotated[
        int,
        Field(
            ge=1,
            description="documents whose line or text is longer than this many characters "
            "are dropped and counted (too_long)",
        ),
    ] = 10_000_000

    def validate(self) -> None:
        """What the declarations cannot say: at least one source."""
        if not self.paths:
            raise ConfigError("documents.paths: is empty; list at least one document corpus")

    @property
    def columns(self) -> DocumentColumns:
        return DocumentColumns(self.id_column, self.sentences_column, self.text_column)

    @property
    def rules(self) -> DocumentRows:
        return DocumentRows(self.columns, self.min_sentences, self.max_chars)


def no_documents() -> DocumentsConfig:
    """A training job's default: no document corpus (it trains on data.path)."""
    return DocumentsConfig(paths=[])


ReadReport = DropReport  # documents are counted like every other corpus


@dataclass
class DocumentCorpus:
    dataset: Any  # ray.data.MaterializedDataset of {doc_id, sentences}
    report: DropReport


def _kept_documents(table: pa.Table) -> pa.Table:
    return table.select(["doc_id", "sentences"]).cast(DOCUMENT_SCHEMA)


def _log(report: DropReport) -> None:
    (logger.warning if report.dropped else logger.info)(report.summary("documents"))


def read_documents(config: DocumentsConfig | None = None, log: bool = True) -> DocumentCorpus:
    """Every source of `config` as one materialised Ray Dataset ``{doc_id, sentences}``.

    Read and cleaned by Ray Data tasks; materialised on purpose (in the object store, not on the
    driver): InfoCSE's rounds re-annotate the same documents without parsing them again, and the
    drop counts are complete before anything uses the documents."""
    config = config or DocumentsConfig()
    config.validate()
    counter = start_drop_counter()
    files = resolve_sources(config.paths, config.hf_split)
    dataset = ray.data.read_datasource(corpus_datasource(files, config.rules, block_rows=1000))
    dataset = dataset.map_batches(KeepCleanRows(counter), batch_size=None, batch_format="pyarrow")
    dataset = dataset.map_batches(_kept_documents, batch_format="pyarrow").materialize()
    report = collect_report(counter)
    ray.kill(counter)
    if log:
        _log(report)
    return DocumentCorpus(dataset, report)


def check_small_documents(config: DocumentsConfig) -> None:
    """Before Ray starts: the sources are listed, and local ones small enough to parse in a
    second or two are parsed, so a missing or unreadable file fails at once, named, instead of
    inside a Ray Data task (no driver pass over a large or remote corpus)."""
    if listed_and_small(config.paths, config.hf_split):
        read_documents_locally(config, log=False)


def read_documents_locally(
    config: DocumentsConfig | None = None, log: bool = True
) -> tuple[list[dict], DropReport]:
    """The same rows without Ray, in file order: for references, tests and small corpora."""
    config = config or DocumentsConfig()
    config.validate()
    report, documents = DropReport(), []
    for block in iter_parsed_blocks(resolve_sources(config.paths, config.hf_split), config.rules):
        report.merge(DropReport.of_block(block))
        kept = block.filter(pc.equal(block.column(DROP), ""))
        documents.extend(kept.select(["doc_id", "sentences"]).to_pylist())
    if log:
        _log(report)
    return documents, report
