"""Pair utilities between InfoCSE rounds: reading pairs, overlap of two rounds, batch layout.

- :func:`pair_overlap`: how many of this round's positives the previous round already had.
  A pair is unordered and compared by text: (a, b) and (b, a) are the same pair.
- :func:`arrange_pairs`: an order of the pairs such that consecutive chunks of ``batch_size``
  (the training batches) hold at most one pair per document wherever that is possible, so two
  sentences of one document are never each other's in-batch negatives while being positives.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq


def read_pairs(path: str) -> list[dict]:
    """Pairs written by the annotator: a Parquet file or a directory of them, in file order."""
    location = Path(path)
    files = [location] if location.is_file() else sorted(location.rglob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"no Parquet pair files at {path}")
    return [row for file in files for row in pq.read_table(file).to_pylist()]


def _pair_key(pair: Mapping | Sequence) -> tuple[str, str]:
    anchor, positive = (pair["anchor"], pair["positive"]) if isinstance(pair, Mapping) else pair
    return (anchor, positive) if anchor <= positive else (positive, anchor)


@dataclass
class PairOverlap:
    previous: int  # distinct unordered pairs in the previous round
    current: int  # distinct unordered pairs in this round
    common: int

    @property
    def new(self) -> int:
        """Pairs of this round the previous round did not have."""
        return self.current - self.common

    @property
    def jaccard(self) -> float:
        union = self.previous + self.current - self.common
        return self.common / union if union else 1.0

    @property
    def kept_fraction(self) -> float:
        """Share of the previous round's pairs found again (NaN when it had none)."""
        return self.common / self.previous if self.previous else float("nan")


def pair_overlap(
    previous: Iterable[Mapping | Sequence], current: Iterable[Mapping | Sequence]
) -> PairOverlap:
    """Overlap of two rounds' pair sets; pairs are ``{anchor, positive}`` rows or 2-tuples."""
    before = {_pair_key(p) for p in previous}
    after = {_pair_key(p) for p in current}
    return PairOverlap(previous=len(before), current=len(after), common=len(before & after))


@dataclass
class BatchArrangement:
    order: np.ndarray  # (P,) indices into the input pairs, in training order
    batch_size: int
    num_batches: int
    batches_with_repeats: int  # batches holding two pairs of one document
    crowded_documents: int  # documents with more pairs than there are batches (must repeat)


def arrange_by_document(doc_ids: Sequence[str], batch_size: int, seed: int = 0) -> BatchArrangement:
    """An order of items such that each ``batch_size`` chunk repeats no document if it can.

    Method: group the items by document (shuffled within a document), put the documents with
    most items first (ties in a seeded random order), and deal the grouped sequence across the
    batches round by round like cards: a document's items land in consecutive slots of the
    deal, hence in distinct batches, unless it has more items than a round has slots (one per
    batch, minus the short last batch in late rounds). Biggest-first puts a document with as
    many items as batches at the start of a full round. A document with more items than
    batches must repeat somewhere; it is counted as crowded.

    Then the full batches are shuffled (the short last batch stays last, so fixed-size chunking
    still finds it there) and so is each batch's content.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be ≥ 1, got {batch_size}")
    rng = np.random.default_rng(seed)
    total = len(doc_ids)
    if total == 0:
        return BatchArrangement(np.zeros(0, dtype=np.int64), batch_size, 0, 0, 0)
    num_batches = -(-total // batch_size)
    last_size = total - (num_batches - 1) * batch_size

    groups: dict[str, list[int]] = {}
    for index, doc_id in enumerate(doc_ids):
        groups.setdefault(doc_id, []).append(index)
    members = [rng.permutation(g) for g in groups.values()]
    tie_break = rng.permutation(len(members))
    by_size = sorted(range(len(members)), key=lambda g: (-len(members[g]), tie_break[g]))
    dealt = np.concatenate([members[g] for g in by_size])  # (P,)

    batches: list[list[int]] = [[] for _ in range(num_batches)]
    position = 0
    for row in range(batch_size):
        for b in range(num_batches):
            if b < num_batches - 1 or row < last_size:
                batches[b].append(int(dealt[position]))
                position += 1
    full = num_batches if last_size == batch_size else num_batches - 1
    batch_order = list(rng.permutation(full)) + list(range(full, num_batches))
    order = np.concatenate([rng.permutation(batches[b]) for b in batch_order]).astype(np.int64)

    repeats = sum(
        len({doc_ids[i] for i in batch}) < len(batch) for batch in batches if len(batch) > 1
    )
    crowded = sum(len(g) > num_batches for g in members)
    return BatchArrangement(order, batch_size, num_batches, repeats, crowded)


def arrange_pairs(
    pairs: Sequence[Mapping], batch_size: int, seed: int = 0
) -> tuple[list[Mapping], BatchArrangement]:
    """Pairs (rows with a ``doc_id``) in training order; see :func:`arrange_by_document`."""
    arrangement = arrange_by_document([str(p["doc_id"]) for p in pairs], batch_size, seed)
    return [pairs[i] for i in arrangement.order], arrangement
