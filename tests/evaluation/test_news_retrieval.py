"""The shipped news retrieval set: rebuilt byte for byte, its invariants, and the build rules."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from distributed_emb.evaluation import beir
from distributed_emb.evaluation.news_retrieval import (
    NewsPair,
    NewsRetrievalError,
    assemble,
    main,
    near_duplicates,
    read_lee_sentences,
)
from distributed_emb.paths import shipped_news_retrieval_dir

SHIPPED = Path(shipped_news_retrieval_dir())
FILES = ("README.md", "corpus.jsonl", "queries.jsonl", "qrels/dev.tsv", "qrels/test.tsv")


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory) -> Path:
    """The set as the documented command writes it (about a second)."""
    output = tmp_path_factory.mktemp("news")
    main([str(output)])
    return output


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def judgements(split: str) -> list[tuple[str, str, int]]:
    lines = (SHIPPED / "qrels" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "query-id\tcorpus-id\tscore"
    return [(q, d, int(g)) for q, d, g in (line.split("\t") for line in lines[1:])]


def test_the_build_writes_the_shipped_files_byte_for_byte(rebuilt):
    shipped = sorted(p.relative_to(SHIPPED).as_posix() for p in SHIPPED.rglob("*") if p.is_file())
    assert shipped == sorted(FILES)
    for name in FILES:
        assert (rebuilt / name).read_bytes() == (SHIPPED / name).read_bytes(), name


def test_shipped_counts_are_the_documented_ones():
    # docs/EVALUATION.md ("An in-domain example") and the set's README quote these.
    corpus = records(SHIPPED / "corpus.jsonl")
    assert len(corpus) == 9782
    assert len(records(SHIPPED / "queries.jsonl")) == 294 + 295
    grades = {split: Counter(g for _, _, g in judgements(split)) for split in ("dev", "test")}
    assert grades == {"dev": {2: 111, 1: 183}, "test": {2: 114, 1: 181}}
    assert {split: len({q for q, _, _ in judgements(split)}) for split in grades} == {
        "dev": 294,
        "test": 295,
    }
    origins = Counter(re.match(r"(stsb-\w+|lee)-", doc["_id"])[1] for doc in corpus)
    assert origins == {"stsb-dev": 498, "stsb-test": 497, "stsb-train": 6265, "lee": 2522}


def test_shipped_set_keeps_its_invariants():
    corpus = {doc["_id"]: doc["text"] for doc in records(SHIPPED / "corpus.jsonl")}
    queries = {query["_id"]: query["text"] for query in records(SHIPPED / "queries.jsonl")}
    assert len(corpus) == len(records(SHIPPED / "corpus.jsonl"))  # ids unique
    assert len(set(corpus.values())) == len(corpus)  # one id per distinct text
    assert not set(queries.values()) & set(corpus.values())  # no query can find itself
    queries_of = {split: {q for q, _, _ in judgements(split)} for split in ("dev", "test")}
    assert not queries_of["dev"] & queries_of["test"]
    assert queries_of["dev"] | queries_of["test"] == set(queries)  # no unjudged query
    for split, prefix in (("dev", "stsb-dev-"), ("test", "stsb-test-")):
        for query_id, doc_id, grade in judgements(split):
            assert grade in (1, 2)
            assert query_id.startswith(prefix) and query_id.endswith("-s1")
            assert doc_id.startswith(prefix) and doc_id.endswith("-s2")
            assert doc_id in corpus
    # The project's own BEIR reader takes it as it is.
    dev, test = beir.read_splits(str(SHIPPED), ["dev", "test"])
    assert (len(dev.query_ids), len(test.query_ids), len(dev.corpus_ids)) == (294, 295, 9782)


def pair(pair_id: str, score: float, s1: str, s2: str) -> NewsPair:
    return NewsPair(pair_id, "headlines", score, s1, s2)


def test_rules_on_hand_made_pairs():
    cat = "A cat sat on the mat today"
    query_pairs = {
        "dev": [
            pair("stsb-dev-0001", 4.2, cat, "The cat was sitting on the mat"),
            pair("stsb-dev-0002", 3.1, cat, "A cat on a mat"),  # merged into one query
            pair("stsb-dev-0003", 3.0, cat, "The cat was sitting on the mat"),  # grade 2 kept
            pair("stsb-dev-0004", 5.0, "Dogs bark at night", "Dogs bark at night"),  # dropped
            pair("stsb-dev-0005", 1.0, "Stocks fell sharply", "Markets dropped"),  # distractor
            # Its words equal the second sentence of pair 6, which does not judge it: dropped.
            pair("stsb-dev-0006", 2.0, "Macron in Paris", "The president visited Paris."),
            pair("stsb-dev-0007", 4.0, "the president visited paris", "Leader in French capital"),
        ],
        "test": [
            pair("stsb-test-0001", 4.5, cat, "Kitten on a rug"),  # a dev query: dropped
            pair("stsb-test-0002", 3.5, "Rain is expected in Sydney", "Showers for Sydney"),
        ],
    }
    distractors = {
        "train": [
            ("stsb-train-0001-s1", "rain is expected in Sydney!"),  # nearly a query
            ("stsb-train-0001-s2", "Markets dropped"),  # already in the corpus
            ("stsb-train-0002-s1", "Something else entirely"),
        ]
    }
    built = assemble(query_pairs, distractors)
    assert built.qrels == {
        "dev": {"stsb-dev-0001-s1": {"stsb-dev-0001-s2": 2, "stsb-dev-0002-s2": 1}},
        "test": {"stsb-test-0002-s1": {"stsb-test-0002-s2": 1}},
    }
    assert built.queries == {
        "stsb-dev-0001-s1": cat,
        "stsb-test-0002-s1": query_pairs["test"][1].sentence1,
    }
    assert list(built.corpus) == [
        "stsb-dev-0001-s2",
        "stsb-dev-0002-s2",
        "stsb-dev-0004-s2",
        "stsb-dev-0005-s2",
        "stsb-dev-0006-s2",
        "stsb-dev-0007-s2",
        "stsb-test-0001-s2",
        "stsb-test-0002-s2",
        "stsb-train-0002-s1",
    ]
    assert built.left_out == {
        "queries whose text is a dev or test second sentence": 1,
        "queries nearly equal to a second sentence they are not judged on": 1,
        "test queries that are also queries of an earlier split": 1,
        "train equal or nearly equal to a query": 1,
    }


def test_near_duplicates_is_word_set_jaccard_at_seven_tenths():
    ten = "a b c d e f g h i j"
    found = near_duplicates(["A b, c d e f g!", "a b c d e f", "J I H G F E D C B A", ""], [ten])
    assert found[:, 0].tolist() == [True, False, True, False]  # 7/10, 6/10, 10/10, empty


def test_a_bad_lee_line_is_named(tmp_path):
    path = tmp_path / "lee.jsonl"
    path.write_text(
        '{"id": "lee-0", "sentences": ["One."]}\n{"id": "lee-1", "sentences": "Two."}\n'
    )
    with pytest.raises(NewsRetrievalError, match=re.escape(f"{path}:2: expected a 'sentences'")):
        read_lee_sentences(path)
    path.write_text('{"id": "lee-0", "sentences": ["One.", "Two  words."]}\n')
    assert read_lee_sentences(path) == [("lee-000-00", "One."), ("lee-000-01", "Two words.")]
