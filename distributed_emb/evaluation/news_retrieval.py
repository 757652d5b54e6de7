"""The shipped news retrieval set (``resources/retrieval/news``), built from shipped data.

A real, labelled, in-domain example of the BEIR layout (``corpus.jsonl``, ``queries.jsonl``,
``qrels/<split>.tsv``) that the package may redistribute, so that a user sees what their own
set should look like and what the given model scores on one. It is made from:

- STS Benchmark's news pairs (genre ``main-news``), human-rated 0–5. In ``sts-dev.csv``
  (the ``dev`` split) and ``sts-test.csv`` (``test``), a pair scored 3 or more gives a query,
  its first sentence, whose relevant document is its second sentence: grade 2 when scored
  ≥ 4, grade 1 when 3 ≤ score < 4. The second sentence of a pair scored below 3 is a hard
  distractor: same story, judged not equivalent. Both sentences of ``sts-train.csv``'s news
  pairs are distractors (no queries come from train): without them the given model scores
  nDCG@10 ≈ 98, with nothing left to show.
- The Lee news corpus (``corpus/lee_documents.jsonl``): unlabelled news sentences, the kind
  a user trains on, as in-domain distractors.

Deduplication, so that no query finds an unjudged copy of itself at rank 1:

- one document id per distinct text (the first occurrence names it); one query per distinct
  first sentence in a split, its pairs' judgements merged (the higher grade kept when two
  pairs judge the same document); a test query that is also a dev query is dropped;
- a query is dropped when its text is a dev or test second sentence (its own positive
  included), or when its words nearly equal those of one it is not judged against;
- a distractor (train or Lee) is left out when its text is a query's, or its words nearly
  equal a query's. "Nearly equal": Jaccard similarity of the lowercased ``\\w+`` word sets
  ≥ :data:`NEAR_DUPLICATE_JACCARD`. STS-B reuses stories across its files (MSRpar's train
  and test share sentence clusters, headlines recur), and the pairs this catches are copies
  with a changed number or word ("won 31 percent ... four percent" / "... 4 percent").

Ids say where a text came from: ``stsb-dev-0042-s1`` is the first sentence on line 42 of
``sts-dev.csv``; ``lee-017-03`` the fourth sentence of the 18th Lee document (0-based). The
build is deterministic: ``python -m distributed_emb.evaluation.news_retrieval DIR`` writes
the shipped files, README included, byte for byte.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import sparse

from distributed_emb.data.beir_layout import jsonl_text, qrels_text
from distributed_emb.errors import UserInputError
from distributed_emb.evaluation.senteval_data import (
    normalise_sentence,
    read_lines,
    read_sts_benchmark,
)
from distributed_emb.paths import shipped_corpus, shipped_senteval_dir

NEWS_GENRE = "main-news"
GRADE_2_MIN_SCORE = 4.0
GRADE_1_MIN_SCORE = 3.0
NEAR_DUPLICATE_JACCARD = 0.7
QUERY_SPLITS = ("dev", "test")  # the qrels splits, each from the STS-B file of its name
DISTRACTOR_SPLIT = "train"


class NewsRetrievalError(UserInputError):
    """An input of the news retrieval build is missing or malformed; names file and line."""


@dataclass(frozen=True)
class NewsPair:
    """One STS-B news row; ``pair_id`` is ``stsb-<split>-<line>`` (1-based line, 4 digits)."""

    pair_id: str
    source: str  # STS-B's `file` column: MSRpar, headlines or deft-news
    score: float
    sentence1: str
    sentence2: str


def grade(score: float) -> int:
    """Relevance of a pair's second sentence to its first: 2, 1, or 0 (not relevant)."""
    if score >= GRADE_2_MIN_SCORE:
        return 2
    return 1 if score >= GRADE_1_MIN_SCORE else 0


def read_news_pairs(senteval_dir: str | os.PathLike, split: str) -> list[NewsPair]:
    """STS-B's ``main-news`` rows of one split, in file order.

    The pairs come from the project's reader, which checks every row and normalises text as
    SentEval does; it keeps one pair per line but drops the genre and file columns, so those
    two are read from the same lines here.
    """
    pairs = read_sts_benchmark(senteval_dir, split)
    path = Path(senteval_dir) / "STS" / "STSBenchmark" / f"sts-{split}.csv"
    news = []
    for i, line in enumerate(read_lines(path)):
        genre, source = line.strip().split("\t")[:2]
        if genre == NEWS_GENRE:
            pair_id = f"stsb-{split}-{i + 1:04d}"
            s1, s2 = pairs.sentences1[i], pairs.sentences2[i]
            news.append(NewsPair(pair_id, source, float(pairs.scores[i]), s1, s2))
    if not news:
        raise NewsRetrievalError(f"{path}: no {NEWS_GENRE} rows")
    return news


def read_lee_sentences(path: str | os.PathLike) -> list[tuple[str, str]]:
    """(id, text) of every sentence of a ``{"id", "title", "sentences"}`` JSONL file, ids
    ``lee-<document>-<sentence>`` by 0-based position in the file."""
    path = Path(path)
    sentences = []
    for line_no, line in enumerate(read_lines(path), start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise NewsRetrievalError(f"{path}:{line_no}: not valid JSON ({err.msg})") from None
        texts = record.get("sentences") if isinstance(record, dict) else None
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise NewsRetrievalError(f"{path}:{line_no}: expected a 'sentences' list of strings")
        for k, text in enumerate(texts):
            sentences.append((f"lee-{line_no - 1:03d}-{k:02d}", normalise_sentence(text)))
    if not sentences:
        raise NewsRetrievalError(f"{path}: no sentences")
    return sentences


def near_duplicates(texts_a: list[str], texts_b: list[str]) -> np.ndarray:
    """(len(a), len(b)) bool: Jaccard similarity of the texts' word sets (lowercased ``\\w+``)
    ≥ NEAR_DUPLICATE_JACCARD, all pairs at once as a sparse product."""
    words_a = [set(re.findall(r"\w+", text.lower())) for text in texts_a]
    words_b = [set(re.findall(r"\w+", text.lower())) for text in texts_b]
    vocabulary = {word: k for k, word in enumerate(sorted(set().union(*words_a, *words_b)))}

    def incidence(word_sets: list[set[str]]) -> sparse.csr_matrix:  # (n, V) 0/1
        rows = [i for i, words in enumerate(word_sets) for _ in words]
        cols = [vocabulary[word] for words in word_sets for word in words]
        ones = np.ones(len(rows), dtype=np.float64)
        return sparse.csr_matrix((ones, (rows, cols)), shape=(len(word_sets), len(vocabulary)))

    shared = (incidence(words_a) @ incidence(words_b).T).toarray()  # (len(a), len(b))
    sizes_a = np.array([len(words) for words in words_a], dtype=np.float64)
    sizes_b = np.array([len(words) for words in words_b], dtype=np.float64)
    union = sizes_a[:, None] + sizes_b[None, :] - shared
    # float64 counts and one correctly rounded division: 7/10 is exactly the double 0.7.
    return shared / np.maximum(union, 1.0) >= NEAR_DUPLICATE_JACCARD


@dataclass
class RetrievalSet:
    """A BEIR-layout set in memory; dicts keep the order the files are written in."""

    corpus: dict[str, str]  # document id → text
    queries: dict[str, str]  # query id → text (only queries some split judges)
    qrels: dict[str, dict[str, dict[str, int]]]  # split → query id → document id → grade
    corpus_origins: Counter  # where the documents come from → how many
    left_out: Counter  # what was dropped, and why → how many


def assemble(
    query_pairs: dict[str, list[NewsPair]], distractors: dict[str, list[tuple[str, str]]]
) -> RetrievalSet:
    """The set from the query splits' pairs and the distractors, given as origin → [(id,
    text)] in corpus order (the rules: the module docstring)."""
    corpus, origins = _second_sentences(query_pairs)  # corpus: text → id while building
    left_out: Counter = Counter()
    queries, qrels = _judged_queries(query_pairs, corpus, left_out)
    query_texts = list(queries)
    for origin, candidates in distractors.items():
        origins[origin] = 0
        close = near_duplicates([text for _, text in candidates], query_texts).any(axis=1)
        for (doc_id, text), is_close in zip(candidates, close, strict=True):
            if text in queries or is_close:
                left_out[f"{origin} equal or nearly equal to a query"] += 1
            elif text not in corpus:
                corpus[text] = doc_id
                origins[origin] += 1
    return RetrievalSet(
        corpus={doc_id: text for text, doc_id in corpus.items()},
        queries={query_id: text for text, query_id in queries.items()},
        qrels=qrels,
        corpus_origins=origins,
        left_out=left_out,
    )


def _second_sentences(query_pairs: dict[str, list[NewsPair]]) -> tuple[dict[str, str], Counter]:
    """The query splits' distinct second sentences (text → id) and how many of each kind."""
    corpus: dict[str, str] = {}
    origins: Counter = Counter()
    for split, pairs in query_pairs.items():
        relevant = f"{split} second sentences of pairs scored ≥ 3 (relevant)"
        hard = f"{split} second sentences of pairs scored < 3 (hard distractors)"
        origins[relevant] = origins[hard] = 0
        for pair in pairs:
            if pair.sentence2 not in corpus:
                corpus[pair.sentence2] = f"{pair.pair_id}-s2"
                origins[relevant if grade(pair.score) else hard] += 1
    return corpus, origins


def _judged_queries(
    query_pairs: dict[str, list[NewsPair]], corpus: dict[str, str], left_out: Counter
) -> tuple[dict[str, str], dict[str, dict[str, dict[str, int]]]]:
    """Queries (text → id) and each split's qrels; counts what it drops in `left_out`."""
    judged_pairs = [p for pairs in query_pairs.values() for p in pairs if grade(p.score)]
    judged_texts: dict[str, set[str]] = {}  # query text → its second sentences, all splits
    for pair in judged_pairs:
        judged_texts.setdefault(pair.sentence1, set()).add(pair.sentence2)
    second_sentences = list(corpus)
    close = near_duplicates(list(judged_texts), second_sentences)  # (queries, corpus)
    unjudged_close = {
        text: {second_sentences[j] for j in np.flatnonzero(row)} - judged_texts[text]
        for text, row in zip(judged_texts, close, strict=True)
    }
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, dict[str, int]]] = {}
    for split, pairs in query_pairs.items():
        judged: dict[str, dict[str, int]] = {}
        for pair in pairs:
            relevance = grade(pair.score)
            if not relevance:
                continue
            if pair.sentence1 in corpus:
                left_out["queries whose text is a dev or test second sentence"] += 1
                continue
            if unjudged_close[pair.sentence1]:
                left_out["queries nearly equal to a second sentence they are not judged on"] += 1
                continue
            query_id = queries.setdefault(pair.sentence1, f"{pair.pair_id}-s1")
            if query_id not in judged and any(query_id in q for q in qrels.values()):
                left_out[f"{split} queries that are also queries of an earlier split"] += 1
                continue
            documents = judged.setdefault(query_id, {})
            doc_id = corpus[pair.sentence2]
            documents[doc_id] = max(documents.get(doc_id, 0), relevance)
        qrels[split] = judged
    return queries, qrels


def news_distractors(
    train_pairs: list[NewsPair], lee_sentences: list[tuple[str, str]]
) -> dict[str, list[tuple[str, str]]]:
    """Distractors by origin, in the order they enter the corpus."""
    train = [
        (f"{pair.pair_id}-{side}", text)
        for pair in train_pairs
        for side, text in (("s1", pair.sentence1), ("s2", pair.sentence2))
    ]
    return {
        f"{DISTRACTOR_SPLIT} news sentences (both of each pair; distractors)": train,
        "Lee news corpus sentences (distractors)": lee_sentences,
    }


def build_news_retrieval(
    senteval_dir: str | os.PathLike,
    lee_documents_path: str | os.PathLike,
    output_dir: str | os.PathLike,
) -> RetrievalSet:
    """Write corpus.jsonl, queries.jsonl, qrels/dev.tsv, qrels/test.tsv and README.md to
    `output_dir` (created if needed) from SentEval's downstream directory (for STS-B) and the
    Lee documents; returns the set."""
    query_pairs = {split: read_news_pairs(senteval_dir, split) for split in QUERY_SPLITS}
    train_pairs = read_news_pairs(senteval_dir, DISTRACTOR_SPLIT)
    distractors = news_distractors(train_pairs, read_lee_sentences(lee_documents_path))
    built = assemble(query_pairs, distractors)
    out = Path(output_dir)
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    files = {
        "corpus.jsonl": jsonl_text(
            [{"_id": i, "title": "", "text": t} for i, t in built.corpus.items()]
        ),
        "queries.jsonl": jsonl_text([{"_id": i, "text": t} for i, t in built.queries.items()]),
        **{f"qrels/{split}.tsv": qrels_text(q) for split, q in built.qrels.items()},
        "README.md": readme(built, {**query_pairs, DISTRACTOR_SPLIT: train_pairs}),
    }
    for name, text in files.items():
        (out / name).write_bytes(text.encode("utf-8"))
    return built


def readme(built: RetrievalSet, pairs_by_split: dict[str, list[NewsPair]]) -> str:
    """The set's README: what it is, its counts, where each text comes from, its licences."""
    lines = [
        "# News retrieval (BEIR layout)",
        "",
        "Generated by `python -m distributed_emb.evaluation.news_retrieval DIR` from the shipped",
        "STS Benchmark and Lee news corpus; do not edit by hand. How queries, grades and",
        "distractors are chosen: that module's docstring and docs/EVALUATION.md.",
        "",
        "| split | queries | grade 2 (score ≥ 4) | grade 1 (3 ≤ score < 4) |",
        "|---|---|---|---|",
    ]
    for split, judged in built.qrels.items():
        grades = Counter(g for documents in judged.values() for g in documents.values())
        lines.append(f"| {split} | {len(judged)} | {grades[2]} | {grades[1]} |")
    lines += ["", f"Corpus: {len(built.corpus)} distinct texts.", ""]
    lines += [f"- {origin}: {n}" for origin, n in built.corpus_origins.items()]
    lines += ["", "Left out:", ""]
    lines += [f"- {reason}: {n}" for reason, n in built.left_out.items()]
    lines += ["", "STS-B news pairs read, by the `file` column:", ""]
    lines += ["| STS-B file | source | pairs |", "|---|---|---|"]
    for split, pairs in pairs_by_split.items():
        for source, n in sorted(Counter(p.source for p in pairs).items()):
            lines.append(f"| sts-{split}.csv | {source} | {n} |")
    return "\n".join(lines) + "\n\n" + LICENCE_NOTES


LICENCE_NOTES = """\
## Provenance and licences

- STS Benchmark (Cer et al., 2017; http://ixa2.si.ehu.eus/stswiki), as shipped in
  `resources/senteval/downstream/STS/STSBenchmark/` (its `LICENSE.txt` and `readme.txt`).
  Its similarity scores, from which the grades here are derived, are CC BY-SA 4.0
  (https://creativecommons.org/licenses/by-sa/4.0/); these qrels are shared under the same
  licence. The texts keep their sources' terms:
  - MSRpar: the Microsoft Research Paraphrase Corpus, under Microsoft Research's licence
    terms for it. STS-B's readme asks that the test part of MSR-Paraphrase not be used to
    train or develop systems; MSRpar pairs are in both splits here.
  - headlines: mined from news RSS feeds by the European Media Monitor (EMM, Best et al.
    2005), subject to the EMM site's legal notice
    (http://europa.eu/geninfo/legal_notices_en.htm); acknowledge EMM when reusing it.
  - deft-news (train sentences only, as distractors): news article data of the DEFT project.
- Lee news corpus (Lee, Pincombe & Welsh, 2005): 300 short news documents from gensim's
  `lee_background.cor`, distributed with gensim for research use.

Cite Agirre et al., SemEval-2017 Task 1 (the STS Benchmark), and Lee, Pincombe & Welsh
(2005), "An empirical evaluation of models of text document similarity".
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Write the news retrieval set (BEIR layout) from the shipped STS Benchmark "
        "and Lee news corpus; the shipped copy is distributed_emb.paths."
        "shipped_news_retrieval_dir()."
    )
    parser.add_argument("output_dir", help="where to write corpus.jsonl, queries.jsonl, qrels/")
    args = parser.parse_args(argv)
    built = build_news_retrieval(
        shipped_senteval_dir(), shipped_corpus("lee_documents.jsonl"), args.output_dir
    )
    counts = ", ".join(f"{split} {len(judged)} queries" for split, judged in built.qrels.items())
    print(f"{args.output_dir}: {counts}, corpus {len(built.corpus)} texts")


if __name__ == "__main__":
    main()
