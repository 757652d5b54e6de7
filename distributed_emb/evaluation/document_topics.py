"""The document-level yardstick: topic retrieval on held-out documents, in the BEIR layout.

"Is this passage about the same thing?" — the question a user who searches documents asks,
and not the one STS and the shipped news set ask ("does this sentence say the same thing?").
The two can move in opposite directions (docs/EVALUATION.md, "Two yardsticks"), so a run on
documents is chosen and reported on this one too. No labels: it is built from the user's own
documents.

- **Held out by document.** A document belongs to the set when
  :func:`~distributed_emb.data.held_out.held_out_split` puts it in "dev" or
  "test" (a seeded hash of its id, decided row by row: the same function keeps those
  documents out of annotation and training, so the set is disjoint from training by
  construction).
- **Passages.** Each held-out document is cut into passages of `sentences_per_passage`
  consecutive sentences (its first `max_passages_per_document` passages: a long Wikipedia
  article does not outweigh a news story). A document with fewer than 2 passages is left out
  (a query needs a relevant passage) and counted.
- **Queries and relevance.** Every passage is a query. Its relevant documents are the other
  passages of its own document, grade 1; every passage of every other held-out document is
  a distractor. A query is also a corpus entry with the same id, and BEIR's
  ``ignore_identical_ids`` (evaluation/beir.py) drops a query's hit on itself, as in Quora or
  ArguAna. The corpus is all held-out passages, dev and test together, as BEIR's dev and test
  splits share one corpus: test documents' text is a distractor of dev queries, but no test
  judgement ever chooses anything.

Ids say where a text comes from: ``lee-17#2`` is the third passage of document ``lee-17``.
Deterministic: the same documents and settings write the same files, byte for byte.
``python -m distributed_emb.evaluation.document_topics DIR`` writes the shipped example
(``shipped:news-documents``) from the shipped Lee news documents.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from distributed_emb.data.beir_layout import jsonl_text, qrels_text
from distributed_emb.data.held_out import HeldOutConfig, held_out_split

log = logging.getLogger(__name__)

SPLITS = ("dev", "test")
PASSAGE_SEPARATOR = "#"
# The shipped example is held out as InfoCSE's default run holds its documents out.
SHIPPED = HeldOutConfig()


@dataclass
class TopicSet:
    """A built set in memory: passages, each split's qrels, and what was left out."""

    passages: dict[str, str] = field(default_factory=dict)  # passage id → text, corpus order
    qrels: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)  # split → q → d
    documents: Counter = field(default_factory=Counter)  # split → documents kept
    left_out: Counter = field(default_factory=Counter)  # reason → documents or passages

    def query_count(self, split: str) -> int:
        return len(self.qrels.get(split, {}))


def passages_of(sentences: Iterable[str], sentences_per_passage: int, limit: int) -> list[str]:
    """A document's first `limit` passages of `sentences_per_passage` consecutive non-empty
    sentences (the last one may be shorter), whitespace collapsed."""
    kept = [" ".join(str(s).split()) for s in sentences]
    kept = [s for s in kept if s]
    cut = [
        " ".join(kept[start : start + sentences_per_passage])
        for start in range(0, len(kept), sentences_per_passage)
    ]
    return cut[:limit]


def build_topic_set(
    documents: Iterable[Mapping],
    fraction: float,
    seed: int = 0,
    sentences_per_passage: int = 3,
    max_passages_per_document: int = 8,
) -> TopicSet:
    """The set from ``{doc_id, sentences}`` rows: the held-out ones (dev or test by
    held_out_split(doc_id, fraction, seed)) cut into passages, every other row ignored.
    Documents are taken in doc_id order, so file order does not matter."""
    built = TopicSet(qrels={split: {} for split in SPLITS})
    seen_texts: set[str] = set()
    for document in sorted(documents, key=lambda d: str(d["doc_id"])):
        doc_id = str(document["doc_id"])
        split = held_out_split(doc_id, fraction, seed)
        if split is None:
            continue
        passages = []
        for text in passages_of(
            document["sentences"], sentences_per_passage, max_passages_per_document
        ):
            # A text twice in the corpus would be judged relevant under one id and a
            # distractor under the other.
            if text in seen_texts:
                built.left_out["passages whose text is another passage's"] += 1
                continue
            seen_texts.add(text)
            passages.append(text)
        if len(passages) < 2:
            built.left_out["documents with fewer than 2 passages"] += 1
            continue
        ids = [f"{doc_id}{PASSAGE_SEPARATOR}{k}" for k in range(len(passages))]
        built.passages.update(zip(ids, passages, strict=True))
        for query in ids:
            built.qrels[split][query] = {other: 1 for other in ids if other != query}
        built.documents[split] += 1
    return built


def write_topic_set(
    built: TopicSet, directory: str | os.PathLike, provenance: Mapping[str, object]
) -> str:
    """corpus.jsonl, queries.jsonl, qrels/<split>.tsv (the splits with queries) and README.md
    into `directory`; returns it. `provenance`: what the set was built from and with (the
    README lists it)."""
    if not any(built.qrels.values()):
        raise ValueError(
            "no held-out document has 2 passages: nothing to evaluate "
            f"({dict(built.left_out) or 'no document held out'}); raise the held-out fraction"
        )
    out = Path(directory)
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    queried = {q for judged in built.qrels.values() for q in judged}
    files = {
        "corpus.jsonl": jsonl_text(
            [{"_id": i, "title": "", "text": t} for i, t in built.passages.items()]
        ),
        "queries.jsonl": jsonl_text(
            [{"_id": i, "text": t} for i, t in built.passages.items() if i in queried]
        ),  # fmt: skip
        **{f"qrels/{s}.tsv": qrels_text(q) for s, q in built.qrels.items() if q},
        "README.md": readme(built, provenance),
    }
    for name, text in files.items():
        (out / name).write_bytes(text.encode("utf-8"))
    return str(out)


def readme(built: TopicSet, provenance: Mapping[str, object]) -> str:
    lines = [
        "# Document-level topic retrieval (BEIR layout)",
        "",
        "Generated by `distributed_emb.evaluation.document_topics` from held-out documents;",
        "do not edit by hand. A query is a passage of a held-out document; the other passages",
        "of its document are relevant (grade 1); every other held-out passage is a distractor.",
        "A query is also a corpus entry with its own id (BEIR's ignore_identical_ids drops that",
        'hit). How and why: docs/EVALUATION.md, "Two yardsticks".',
        "",
        "| split | documents | queries |",
        "|---|---|---|",
    ]
    for split, judged in built.qrels.items():
        lines.append(f"| {split} | {built.documents[split]} | {len(judged)} |")
    lines += ["", f"Corpus: {len(built.passages)} passages.", "", "Built from:", ""]
    lines += [f"- {key}: {value}" for key, value in provenance.items()]
    if built.left_out:
        lines += ["", "Left out:", ""]
        lines += [f"- {reason}: {n}" for reason, n in sorted(built.left_out.items())]
    return "\n".join(lines) + "\n"


def write_held_out_yardstick(
    held_rows: list[Mapping], heldout: HeldOutConfig, sources: list[str], directory: str | Path
) -> str | None:
    """The yardstick of a run's held-out documents (`held_rows`, split by `heldout`) written
    to `directory`; None, logged, when no held-out document has 2 passages. InfoCSE's rounds
    and a training run on documents both build theirs here."""
    built = build_topic_set(
        held_rows,
        heldout.fraction,
        heldout.seed,
        heldout.sentences_per_passage,
        heldout.max_passages_per_document,
    )
    if not any(built.qrels.values()):
        log.warning("heldout: no held-out document has 2 passages: no document-level yardstick")
        return None
    provenance = {
        "documents": ", ".join(sources),
        "held out": f"heldout.fraction {heldout.fraction}, heldout.seed {heldout.seed} (never "
        "annotated or trained on by the run)",
        "passages": f"{heldout.sentences_per_passage} sentences each, at most "
        f"{heldout.max_passages_per_document} per document",
    }
    written = write_topic_set(built, directory, provenance)
    log.warning(
        "heldout: document-level yardstick (topic retrieval among held-out passages) in %s: "
        "dev %d queries, test %d", written, built.query_count("dev"), built.query_count("test"),
    )  # fmt: skip
    return written


SHIPPED_PROVENANCE_NOTE = (
    "the Lee news corpus (Lee, Pincombe & Welsh, 2005): 300 short news documents from "
    "gensim's `lee_background.cor`, distributed with gensim for research use"
)


def main(argv: list[str] | None = None) -> None:
    from distributed_emb.data.documents import DocumentsConfig, read_documents_locally
    from distributed_emb.paths import shipped_corpus

    parser = argparse.ArgumentParser(
        description="Write the shipped document-level example (BEIR layout) from the shipped "
        "Lee news documents, held out as InfoCSE's default run holds them out."
    )
    parser.add_argument("output_dir", help="where to write corpus.jsonl, queries.jsonl, qrels/")
    args = parser.parse_args(argv)
    documents, _ = read_documents_locally(
        DocumentsConfig(paths=[shipped_corpus("lee_documents.jsonl")]), log=False
    )
    h = SHIPPED
    built = build_topic_set(
        documents, h.fraction, h.seed, h.sentences_per_passage, h.max_passages_per_document
    )
    provenance = {
        "documents": SHIPPED_PROVENANCE_NOTE,
        "held out": f"fraction {h.fraction}, seed {h.seed} (heldout.*'s defaults: these "
        "documents are never annotated or trained on by InfoCSE's default run)",
        "passages": f"{h.sentences_per_passage} sentences each, at most "
        f"{h.max_passages_per_document} per document",
    }
    write_topic_set(built, args.output_dir, provenance)
    counts = ", ".join(f"{s} {built.query_count(s)} queries" for s in SPLITS)
    print(f"{args.output_dir}: {counts}, corpus {len(built.passages)} passages")


if __name__ == "__main__":
    main()
