"""Document readers: sentence splitting, every bad-row reason counted, Ray = local, formats."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from distributed_emb.checks import ConfigError
from distributed_emb.data.documents import (
    DROP_REASONS,
    DocumentsConfig,
    read_documents,
    read_documents_locally,
    split_sentences,
)
from distributed_emb.data.sources import CorpusError
from distributed_emb.settings import build

# (line, expected drop reason or None when kept)
JSONL_CASES: list[tuple[bytes, str | None]] = [
    (b'{"id": "a", "sentences": ["One.", "Two."]}', None),
    (b'{"id": 7, "text": "First sentence here. Second one follows! Third?"}', None),
    (b'{"id": "b", "sentences": [', "invalid_json"),
    (b"", "blank_line"),
    (b"[1, 2]", "not_an_object"),
    (b'{"sentences": ["A.", "B."]}', "missing_id"),
    (b'{"id": "  ", "text": "A. B."}', "missing_id"),
    (b'{"id": ["x"], "sentences": ["A.", "B."]}', "bad_id"),
    (b'{"id": true, "sentences": ["A.", "B."]}', "bad_id"),
    (b'{"id": "c", "text": "   "}', "empty_text"),
    (b'{"id": "d"}', "empty_text"),
    (b'{"id": "d2", "sentences": []}', "empty_text"),
    (b'{"id": "e", "sentences": ["Only one."]}', "too_few_sentences"),
    (b'{"id": "f", "text": "Just one sentence here."}', "too_few_sentences"),
    (b'{"id": "g", "sentences": "A. B."}', "sentences_not_list"),
    (b'{"id": "h", "sentences": ["A.", 3]}', "sentence_not_string"),
    (b'{"id": "i", "text": 5}', "text_not_string"),
    (b'{"id": "u", "text": "caf\xe9 au lait. Bon."}', "invalid_utf8"),
    (b'{"id": "j", "sentences": ["A.", "  ", "B."]}', None),
    (b'{"id": "k", "sentences": ["A.", "   "]}', "too_few_sentences"),
    (b'{"id": "l", "text": "' + b"Long. " * 100 + b'"}', "too_long"),  # max_chars=500
]

EXPECTED_KEPT = {
    "a": ["One.", "Two."],
    "7": ["First sentence here.", "Second one follows!", "Third?"],
    "j": ["A.", "B."],
}


def expected_drops() -> dict[str, int]:
    counts: dict[str, int] = {}
    for _, reason in JSONL_CASES:
        if reason:
            counts[reason] = counts.get(reason, 0) + 1
    return counts


@pytest.fixture()
def bad_jsonl(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(line for line, _ in JSONL_CASES) + b"\n")
    return path


def test_every_reason_is_exercised_and_documented():
    assert set(expected_drops()) == set(DROP_REASONS)


def test_split_sentences_rule():
    assert split_sentences('It rained. Then it stopped! Did it? "Yes," he said.') == [
        "It rained.",
        "Then it stopped!",
        "Did it?",
        '"Yes," he said.',
    ]
    # Closing quote stays with its sentence; an opening quote starts the next one.
    assert split_sentences('He said "stop." "Why?" she asked.') == [
        'He said "stop."',
        '"Why?" she asked.',
    ]
    # Titles and initials do not end sentences; lower case and digits after a period do not.
    assert split_sentences("Dr. Smith met J. R. Tolkien. It was 3 p.m. today. And 4.5 more.") == [
        "Dr. Smith met J. R. Tolkien.",
        "It was 3 p.m. today.",
        "And 4.5 more.",
    ]
    # Paragraph breaks always split; single newlines are just whitespace.
    assert split_sentences("Title line\n\nA sentence\nwrapped here. Next one") == [
        "Title line",
        "A sentence wrapped here.",
        "Next one",
    ]
    assert split_sentences("  \n ") == []


def test_local_reader_counts_every_bad_row(bad_jsonl):
    documents, report = read_documents_locally(
        DocumentsConfig(paths=[str(bad_jsonl)], max_chars=500), log=False
    )
    assert {d["doc_id"]: d["sentences"] for d in documents} == EXPECTED_KEPT
    assert report.dropped == expected_drops()
    assert report.rows == len(JSONL_CASES) and report.kept == len(EXPECTED_KEPT)
    assert report.blank_sentences_removed == 1  # from kept "j" ("k" is dropped whole)
    # JSON errors name the file and the line.
    assert report.examples["invalid_json"] == [f"{bad_jsonl}:3: Expecting value"]
    assert report.examples["not_an_object"] == [f"{bad_jsonl}:5: got list"]
    assert report.examples["invalid_utf8"][0].startswith(f"{bad_jsonl}:18: ")
    summary = report.summary()
    assert "kept 3" in summary and f"{bad_jsonl}:3" in summary


@pytest.mark.ray
def test_ray_reader_matches_local_and_counts(ray_local, bad_jsonl, caplog):
    config = DocumentsConfig(paths=[str(bad_jsonl)], max_chars=500)
    with caplog.at_level("WARNING", logger="distributed_emb.data.documents"):
        corpus = read_documents(config)
    rows = corpus.dataset.take_all()
    assert {r["doc_id"]: list(r["sentences"]) for r in rows} == EXPECTED_KEPT
    assert set(rows[0]) == {"doc_id", "sentences"}
    local_docs, local_report = read_documents_locally(config, log=False)
    assert corpus.report.dropped == local_report.dropped == expected_drops()
    assert corpus.report.rows == len(JSONL_CASES)
    assert corpus.report.examples["invalid_json"] == [f"{bad_jsonl}:3: Expecting value"]
    assert f"{bad_jsonl}:3" in caplog.text  # logged, not silent


@pytest.mark.ray
def test_parquet_and_hf_with_custom_columns(ray_local, tmp_path):
    datasets = pytest.importorskip("datasets")
    records = {
        "key": ["p1", "p2", None, "p4", "p5"],
        "sents": [["A.", "B."], None, ["C.", "D."], ["Only."], None],
        "body": [None, "One here. Two here.", None, None, ""],
        "extra": [1, 2, 3, 4, 5],
    }
    table = pa.table(records)
    (tmp_path / "pq").mkdir()
    pq.write_table(table.slice(0, 3), tmp_path / "pq" / "part-0.parquet")
    pq.write_table(table.slice(3), tmp_path / "pq" / "part-1.parquet")
    hf_dir = tmp_path / "hf"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(records)}).save_to_disk(hf_dir)

    expected_kept = {"p1": ["A.", "B."], "p2": ["One here.", "Two here."]}
    expected_dropped = {"missing_id": 1, "too_few_sentences": 1, "empty_text": 1}
    for source in (tmp_path / "pq", hf_dir):
        config = DocumentsConfig(
            paths=[str(source)], id_column="key", sentences_column="sents", text_column="body"
        )
        corpus = read_documents(config, log=False)
        got = {r["doc_id"]: list(r["sentences"]) for r in corpus.dataset.take_all()}
        assert got == expected_kept, source
        assert corpus.report.dropped == expected_dropped, source
        local_docs, local_report = read_documents_locally(config, log=False)
        assert {d["doc_id"]: d["sentences"] for d in local_docs} == expected_kept
        assert local_report.dropped == expected_dropped

    missing_split = DocumentsConfig(paths=[str(hf_dir)], hf_split="validation")
    with pytest.raises(ValueError, match="no split 'validation'"):
        read_documents_locally(missing_split, log=False)


@pytest.mark.ray
def test_shipped_corpora_read_whole(ray_local, shared_data_dir):
    corpus = read_documents(log=False)  # defaults: the shipped Lee and wiki documents
    assert corpus.report.dropped == {}
    assert corpus.report.kept == corpus.dataset.count() == 300 + 97
    sentences = sum(len(r["sentences"]) for r in corpus.dataset.iter_rows())
    expected = 0
    for name in ("lee_documents.jsonl", "wiki_documents.jsonl"):
        with open(shared_data_dir / "corpus" / name) as handle:
            expected += sum(len(json.loads(line)["sentences"]) for line in handle)
    assert sentences == expected == 2602 + 17920


def test_bad_sources_raise(tmp_path):
    def read(path):
        return read_documents_locally(DocumentsConfig(paths=[str(path)]), log=False)

    with pytest.raises(CorpusError, match="missing.jsonl: does not exist"):
        read(tmp_path / "missing.jsonl")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(CorpusError, match="notes.txt: plain text holds one text a line"):
        read(tmp_path / "notes.txt")
    (tmp_path / "notes.md").write_text("x")
    with pytest.raises(CorpusError, match="notes.md"):
        read(tmp_path / "notes.md")
    # The section's ranges are its declarations (distributed_emb/settings.py).
    with pytest.raises(ConfigError, match=r"^min_sentences: must be >= 1, got 0 — documents"):
        build(DocumentsConfig, {"min_sentences": 0})
    with pytest.raises(ConfigError, match=r"^documents\.paths: is empty"):
        read_documents_locally(DocumentsConfig(paths=[]), log=False)
