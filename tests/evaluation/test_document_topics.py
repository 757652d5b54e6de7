"""The document-level yardstick (evaluation/document_topics.py): built only from held-out
documents, scored as a plain reference scores it, the shipped example reproducible, and both
yardsticks compared with the given model (evaluation/yardsticks.py)."""

import functools
import hashlib
import math
from pathlib import Path

import numpy as np
import pytest

from distributed_emb.data.held_out import held_out_split
from distributed_emb.evaluation import document_topics
from distributed_emb.evaluation.beir import evaluate_splits
from distributed_emb.evaluation.document_topics import (
    build_topic_set,
    passages_of,
    write_topic_set,
)
from distributed_emb.evaluation.eval_config import EvalConfig
from distributed_emb.evaluation.yardsticks import (
    PARAPHRASE_LOSS,
    TOPIC_LOSS,
    compare_with_given,
    topic_loss_line,
    warning_lines,
    yardstick_lines,
)
from distributed_emb.paths import shipped_news_documents_dir

TOPICS = ["river flood rain water", "election vote party minister", "cricket match runs wicket",
          "bushfire smoke wind firefighters", "bank rates market shares"]  # fmt: skip


def _documents(n: int = 40) -> list[dict]:
    """n documents of 4–9 sentences, each about one of TOPICS (words repeated with a twist)."""
    documents = []
    for i in range(n):
        words = TOPICS[i % len(TOPICS)].split()
        sentences = [f"{words[k % 4]} {words[(k + i) % 4]} report {i} line {k}"
                     for k in range(4 + i % 6)]  # fmt: skip
        documents.append({"doc_id": f"d{i:02d}", "sentences": sentences})
    return documents


def _bag_of_words(texts: list[str]) -> np.ndarray:
    """A deterministic encoder: the sum of a fixed random vector per word (64 dims; real
    valued, so no two scores tie and the reference's order is the only order)."""
    out = np.zeros((len(texts), 64))
    for row, text in enumerate(texts):
        for word in text.lower().split():
            out[row] += _word_vector(word)
    return out


@functools.cache
def _word_vector(word: str) -> np.ndarray:
    seed = int(hashlib.md5(word.encode()).hexdigest()[:8], 16)
    return np.random.default_rng(seed).standard_normal(64)


def test_passages_are_consecutive_sentences_cut_to_a_limit():
    sentences = ["a  b", "", "c", "d", "e", "f", "g"]
    assert passages_of(sentences, 2, 8) == ["a b c", "d e", "f g"]
    assert passages_of(sentences, 3, 2) == ["a b c d", "e f g"]
    assert passages_of(sentences, 4, 1) == ["a b c d e"]


def test_only_held_out_documents_are_in_the_set_and_each_passage_judges_its_own_document():
    documents = _documents()
    built = build_topic_set(documents, fraction=0.5, seed=3, sentences_per_passage=2)
    held = {d["doc_id"]: held_out_split(d["doc_id"], 0.5, 3) for d in documents}
    in_set = {pid.split("#")[0] for pid in built.passages}
    assert in_set and in_set <= {d for d, split in held.items() if split is not None}
    assert not in_set & {d for d, split in held.items() if split is None}  # never trained on
    for split, judged in built.qrels.items():
        for query, relevant in judged.items():
            document = query.split("#")[0]
            assert held[document] == split
            expected = {p for p in built.passages if p.split("#")[0] == document} - {query}
            assert set(relevant) == expected and set(relevant.values()) == {1}
    # File order does not matter: the set is a function of the documents.
    again = build_topic_set(documents[::-1], fraction=0.5, seed=3, sentences_per_passage=2)
    assert again.passages == built.passages and again.qrels == built.qrels


def _reference_ndcg_at_10(vectors: dict[str, np.ndarray], query: str, relevant: set[str]):
    """nDCG@10 from the definitions: cosine to every other passage, ties by id descending,
    binary gains 1/log2(rank + 1), the ideal ranking all relevant first."""
    q = vectors[query] / np.linalg.norm(vectors[query])
    scored = []
    for pid, v in vectors.items():
        if pid != query:
            scored.append((float(q @ (v / np.linalg.norm(v))), pid))
    ranking = [pid for _, pid in sorted(scored, reverse=True)][:10]
    dcg = sum(1 / math.log2(r + 2) for r, pid in enumerate(ranking) if pid in relevant)
    ideal = sum(1 / math.log2(r + 2) for r in range(min(len(relevant), 10)))
    return 100 * dcg / ideal


def test_the_set_scored_by_pytrec_eval_equals_a_plain_reference(tmp_path):
    built = build_topic_set(_documents(), fraction=0.9, seed=0, sentences_per_passage=2)
    directory = write_topic_set(built, tmp_path / "topics", {"documents": "a fixture"})
    results = evaluate_splits(_bag_of_words, directory, ["dev", "test"])
    ids = list(built.passages)
    vectors = dict(zip(ids, _bag_of_words([built.passages[i] for i in ids]), strict=True))
    for split in ("dev", "test"):
        per_query = results[split]["per_query"]["ndcg@10"]
        assert set(per_query) == set(built.qrels[split])
        for query, relevant in built.qrels[split].items():
            expected = _reference_ndcg_at_10(vectors, query, set(relevant))
            assert per_query[query] == pytest.approx(expected, abs=1e-6), query
    assert 0 < results["dev"]["metrics"]["ndcg@10"] < 100  # neither trivial nor impossible


def test_the_shipped_example_is_what_the_builder_writes(tmp_path):
    document_topics.main([str(tmp_path)])
    shipped = Path(shipped_news_documents_dir())
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/dev.tsv", "qrels/test.tsv", "README.md"):
        assert (tmp_path / name).read_bytes() == (shipped / name).read_bytes(), name


def test_a_set_without_two_passages_is_refused_with_what_was_left_out(tmp_path):
    built = build_topic_set([{"doc_id": "x", "sentences": ["one sentence"]}], 0.99)
    with pytest.raises(ValueError, match="no held-out document has 2 passages"):
        write_topic_set(built, tmp_path, {})


def _encoders(models: dict):
    return lambda model_dir, max_seq_length: models[model_dir]


def test_both_yardsticks_against_the_given_model_with_paired_intervals():
    """The same model against itself moves nothing; a model that scrambles topic loses it
    beyond its interval and the run says so in one line."""
    e = EvalConfig(documents_dir="shipped:news-documents", retrieval_dir="shipped:news")
    rng = np.random.default_rng(0)

    def noise(texts):
        return rng.standard_normal((len(texts), 32))

    same = compare_with_given("given", "given", e, _encoders({"given": _bag_of_words}))
    topic = same["topic"]["documents_test"]["ndcg@10"]
    assert topic["difference"] == 0 and topic["n"] == same["topic"]["n_queries"] > 50
    assert same["paraphrase"]["stsb_test"]["difference"] == 0
    assert same["paraphrase"]["retrieval_test"]["ndcg@10"]["n"] == 295  # the news test queries
    assert topic_loss_line(same) is None and warning_lines(same) == []
    lines = yardstick_lines(same)
    assert [line.split(":")[0] for line in lines] == ["paraphrase", "paraphrase", "topic"]
    assert "shipped:news test nDCG@10" in lines[1]

    worse = compare_with_given(
        "given", "scrambled", e, _encoders({"given": _bag_of_words, "scrambled": noise})
    )
    topic = worse["topic"]["documents_test"]["ndcg@10"]
    assert topic["high"] < 0 and topic["excludes_zero"]
    assert topic_loss_line(worse).startswith(TOPIC_LOSS)
    assert [line.split(" — ")[0] for line in warning_lines(worse)] == [TOPIC_LOSS, PARAPHRASE_LOSS]
    assert "*" in yardstick_lines(worse)[-1]
