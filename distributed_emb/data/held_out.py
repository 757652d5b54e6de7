"""Documents held out of training, by document: the one split every method uses.

A document is held out when a hash of (seed, doc_id) falls below `fraction`; below half of
it the document is "dev", above "test" (:func:`held_out_split`). The split depends neither on
file order nor on how many documents there are, and any process can decide any row alone, so
Ray Data tasks split a corpus row by row (:func:`split_held_out`) and held-out documents never
reach annotation or training. InfoCSE's rounds and a training run on documents
(`documents.paths`) score the held-out ones: same-document retrieval of their sentences
(evaluation/document_retrieval.py) and the document-level yardstick built from their
passages (evaluation/document_topics.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Annotated, Any

import pyarrow as pa
from pydantic import Field

from distributed_emb.settings import Seed, section

SPLITS = ("dev", "test")


@section
class HeldOutConfig:
    """Documents held out of annotation and training, each method's in-domain yardstick."""

    # 1 would leave nothing to train on. 0.2: the shipped example's (shipped:news-documents).
    fraction: Annotated[
        float,
        Field(
            ge=0,
            lt=1,
            description="share of documents held out of annotation and training (chosen by a "
            "hash of heldout.seed and the document id), half dev, half test; 0: none",
        ),
    ] = 0.2
    seed: Annotated[Seed, Field(description="seed of the held-out documents' choice")] = 0
    max_sentences_per_document: Annotated[
        int,
        Field(
            ge=2,
            description="a held-out document's first sentences used by same-document "
            "retrieval, each a query against the others",
        ),
    ] = 16
    # 3 sentences ≈ 60–80 words of news: long enough to be about something, short enough
    # that a news story gives 2–3 passages (docs/EVALUATION.md, "Two yardsticks").
    sentences_per_passage: Annotated[
        int,
        Field(ge=1, description="consecutive sentences a passage of the document yardstick holds"),
    ] = 3
    max_passages_per_document: Annotated[
        int,
        Field(
            ge=2,
            description="a held-out document's first passages in the document yardstick (a "
            "long article does not outweigh a news story)",
        ),
    ] = 8


def _unit_interval(seed: int, doc_id: str) -> float:
    digest = hashlib.blake2b(f"{seed}\x00{doc_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


def held_out_split(doc_id: str, fraction: float, seed: int = 0) -> str | None:
    """Where one document goes: "dev" or "test" (the two halves of the held-out documents,
    by the same hash: below fraction/2, or between fraction/2 and fraction), or None
    (trained on). Decided by the document alone, so any process can filter any row."""
    unit = _unit_interval(seed, str(doc_id))
    if unit >= fraction:
        return None
    return "dev" if unit < fraction / 2 else "test"


def held_out_doc_ids(doc_ids: Iterable[str], fraction: float, seed: int = 0) -> set[str]:
    """The documents held out of training: those whose hash of (seed, doc_id) is < fraction."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"held-out fraction must be in [0, 1), got {fraction}")
    return {str(d) for d in doc_ids if _unit_interval(seed, str(d)) < fraction}


def split_held_out(dataset: Any, heldout: HeldOutConfig) -> tuple[Any, dict[str, list[dict]]]:
    """(the documents to train on, as a materialised Ray Dataset, {split: the held-out
    documents' rows}) from a Ray Dataset of ``{doc_id, sentences}``. Decided row by row in Ray
    Data tasks; only the held-out rows (a small share) come to this process."""

    def part(table: pa.Table, split: str | None) -> pa.Table:
        where = [held_out_split(d, heldout.fraction, heldout.seed) == split
                 for d in table.column("doc_id").to_pylist()]  # fmt: skip
        return table.filter(pa.array(where, pa.bool_()))

    def rows(split: str | None):
        return dataset.map_batches(part, batch_format="pyarrow", fn_kwargs={"split": split})

    if heldout.fraction == 0:
        return dataset, {split: [] for split in SPLITS}
    return rows(None).materialize(), {split: rows(split).take_all() for split in SPLITS}
