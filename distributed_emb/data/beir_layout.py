"""The BEIR layout on disk, read and checked: the user's labelled retrieval data.

    DIR/corpus.jsonl        {"_id", "title" (optional), "text"} per line
    DIR/queries.jsonl       {"_id", "text"} per line
    DIR/qrels/<split>.tsv   header `query-id<TAB>corpus-id<TAB>score`, then one judgment a row;
                            graded integer scores, 0 = judged not relevant

A split's queries are those with at least one judgment > 0 in its qrels (as BEIR). A document
is embedded as `(title + " " + text).strip()` (BEIR's dense models). Anything malformed raises
:class:`BeirDataError` naming `file:line`. Low in the layers (no numpy, no torch): the
configuration checks a directory's splits before Ray starts; evaluation/beir.py searches and
scores what is read here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distributed_emb.errors import UserInputError
from distributed_emb.paths import resolve_retrieval_dir

CORPUS_FILE = "corpus.jsonl"
QUERIES_FILE = "queries.jsonl"
QRELS_DIR = "qrels"
EXPECTED_LAYOUT = (
    f"expected the BEIR layout: {CORPUS_FILE}, {QUERIES_FILE} and {QRELS_DIR}/<split>.tsv "
    "in the directory"
)


class BeirDataError(UserInputError):
    """A file of a BEIR-layout directory is missing or malformed; the message names file:line."""


@dataclass(frozen=True)
class RetrievalSplit:
    """One split: the whole corpus, the split's queries (judged relevant at least once) and
    their judgments {query id: {document id: score}}."""

    name: str  # e.g. "dev"
    corpus_ids: list[str]
    corpus_texts: list[str]
    query_ids: list[str]
    query_texts: list[str]
    qrels: dict[str, dict[str, int]]


# --- writing (the sets the package builds: evaluation/news_retrieval.py, document_topics.py) --

QRELS_HEADER = "query-id\tcorpus-id\tscore"


def jsonl_text(records: list[dict]) -> str:
    """corpus.jsonl / queries.jsonl: one JSON object a line, UTF-8 as is."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def qrels_text(judged: dict[str, dict[str, int]]) -> str:
    """qrels/<split>.tsv: the header, then one (query, document, grade) row a judgement."""
    rows = [f"{q}\t{d}\t{g}" for q, documents in judged.items() for d, g in documents.items()]
    return "\n".join([QRELS_HEADER, *rows]) + "\n"


# --- reading ----------------------------------------------------------------------------------


def _root(directory: str) -> Path:
    """The directory itself, or the shipped set it names (`shipped:news`, paths.py)."""
    try:
        return Path(resolve_retrieval_dir(directory))
    except FileNotFoundError as error:
        raise BeirDataError(str(error)) from None


def list_splits(directory: str) -> list[str]:
    """The splits of `directory`: the names of its qrels/*.tsv files, sorted."""
    root = _root(directory)
    if not root.is_dir():
        raise BeirDataError(f"{directory} is not a directory")
    qrels = root / QRELS_DIR
    if not qrels.is_dir():
        raise BeirDataError(f"{qrels}: no such directory; {EXPECTED_LAYOUT}")
    return sorted(p.stem for p in qrels.glob("*.tsv") if p.is_file())


def read_split(directory: str, split: str) -> RetrievalSplit:
    """Read and check the corpus, the queries and `split`'s qrels; raises BeirDataError."""
    return read_splits(directory, [split])[0]


def read_splits(directory: str, splits: list[str]) -> list[RetrievalSplit]:
    """:func:`read_split` of each of `splits`, the corpus and queries read once (the splits
    share the corpus lists)."""
    root = _root(directory)
    present = list_splits(directory)
    for split in splits:
        if split not in present:
            listed = ", ".join(present) if present else "none (no .tsv files)"
            raise BeirDataError(
                f"{root / QRELS_DIR / split}.tsv: no such file; the splits in "
                f"{root / QRELS_DIR} are {listed}"
            )
    corpus_ids, corpus_texts = _read_corpus(root / CORPUS_FILE)
    known_docs = set(corpus_ids)
    queries = _read_queries(root / QUERIES_FILE)
    out = []
    for split in splits:
        qrels_path = root / QRELS_DIR / f"{split}.tsv"
        qrels = _read_qrels(qrels_path, known_docs, queries)
        # The split's queries in queries.jsonl order; their judgments, zeros included.
        query_ids = [q for q in queries if any(score > 0 for score in qrels.get(q, {}).values())]
        if not query_ids:
            raise BeirDataError(f"{qrels_path}: no query has a relevant document (a score > 0)")
        out.append(
            RetrievalSplit(
                name=split,
                corpus_ids=corpus_ids,
                corpus_texts=corpus_texts,
                query_ids=query_ids,
                query_texts=[queries[q] for q in query_ids],
                qrels={q: qrels[q] for q in query_ids},
            )
        )
    return out


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) of each non-blank line; a bad byte names its line."""
    if not path.is_file():
        raise BeirDataError(f"{path}: no such file; {EXPECTED_LAYOUT}")
    with open(path, "rb") as file:
        for number, raw in enumerate(file, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise BeirDataError(f"{path}:{number}: line is not valid UTF-8") from None
            if line.strip():
                yield number, line.rstrip("\r\n")


def _records(path: Path) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """(line, id, record) of each JSON line, its `_id` and `text` checked."""
    for number, line in _lines(path):
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise BeirDataError(f"{where}: not valid JSON ({error.msg})") from None
        if not isinstance(record, dict):
            raise BeirDataError(f"{where}: expected a JSON object, got {type(record).__name__}")
        for key in ("_id", "text"):
            if key not in record:
                raise BeirDataError(f'{where}: no "{key}" field')
        doc_id = record["_id"]
        if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)):
            raise BeirDataError(f'{where}: "_id" must be a string, got {doc_id!r}')
        if not isinstance(record["text"], str):
            raise BeirDataError(f'{where}: "text" must be a string, got {record["text"]!r}')
        yield number, str(doc_id), record


def _read_corpus(path: Path) -> tuple[list[str], list[str]]:
    ids: list[str] = []
    texts: list[str] = []
    first_line: dict[str, int] = {}
    for number, doc_id, record in _records(path):
        if doc_id in first_line:
            raise BeirDataError(
                f"{path}:{number}: duplicate _id {doc_id!r} (first at line {first_line[doc_id]})"
            )
        first_line[doc_id] = number
        title = record.get("title")
        if title is not None and not isinstance(title, str):
            raise BeirDataError(f'{path}:{number}: "title" must be a string, got {title!r}')
        ids.append(doc_id)
        texts.append(f"{title} {record['text']}".strip() if title else record["text"].strip())
    return ids, texts


def _read_queries(path: Path) -> dict[str, str]:
    queries: dict[str, str] = {}
    first_line: dict[str, int] = {}
    for number, query_id, record in _records(path):
        if query_id in first_line:
            raise BeirDataError(
                f"{path}:{number}: duplicate _id {query_id!r} "
                f"(first at line {first_line[query_id]})"
            )
        first_line[query_id] = number
        queries[query_id] = record["text"]
    return queries


def _read_qrels(
    path: Path, corpus_ids: set[str], queries: dict[str, str]
) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = {}
    first_line: dict[tuple[str, str], int] = {}
    header_seen = False
    for number, line in _lines(path):
        where = f"{path}:{number}"
        row = line.split("\t")
        if len(row) != 3:
            raise BeirDataError(
                f"{where}: expected 3 tab-separated columns (query-id, corpus-id, score), "
                f"got {len(row)}"
            )
        query_id, doc_id, text = (cell.strip() for cell in row)
        if not header_seen:  # BEIR skips the first line unread: say so when it is a judgment
            header_seen = True
            if _is_integer(text):
                raise BeirDataError(
                    f"{where}: expected the header query-id<TAB>corpus-id<TAB>score, got a judgment"
                )
            continue
        if not _is_integer(text) or int(text) < 0:
            raise BeirDataError(f"{where}: score {text!r} is not an integer >= 0")
        if query_id not in queries:
            raise BeirDataError(f"{where}: query-id {query_id!r} is not in {QUERIES_FILE}")
        if doc_id not in corpus_ids:
            raise BeirDataError(f"{where}: corpus-id {doc_id!r} is not in {CORPUS_FILE}")
        if (query_id, doc_id) in first_line:
            raise BeirDataError(
                f"{where}: ({query_id!r}, {doc_id!r}) judged twice "
                f"(first at line {first_line[query_id, doc_id]})"
            )
        first_line[query_id, doc_id] = number
        qrels.setdefault(query_id, {})[doc_id] = int(text)
    if not header_seen:
        raise BeirDataError(f"{path}: empty; expected a header and judgments")
    return qrels


def _is_integer(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True
