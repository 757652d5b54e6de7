"""The tables annotation hands along, and the counts it reports.

The annotating actors (or the single-process reference) emit one row per document
(``DOCUMENT_ANNOTATION_SCHEMA``: its clusters and its pairs as lists). The counts of a round
are summed from those rows; the pairs are exploded from them into ``PAIR_SCHEMA`` rows and
written in the order of their spread key. Both annotation paths (annotate.py) and the readers
of their output must agree on these layouts, so each is defined once, here, apart from the Ray
machinery that produces the rows.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

PAIR_SCHEMA = pa.schema(
    [
        ("anchor", pa.string()),
        ("positive", pa.string()),
        ("doc_id", pa.string()),
        ("cluster_id", pa.int64()),
        ("round", pa.int64()),
    ]
)
SPREAD_KEY = "_spread"  # the sort key of the written order, dropped before writing
# One row per document between the actors and the Parquet writer: the counts come from here.
DOCUMENT_ANNOTATION_SCHEMA = pa.schema(
    [
        ("doc_id", pa.string()),
        ("num_sentences", pa.int64()),
        ("num_clusters", pa.int64()),
        ("capped_clusters", pa.int64()),
        ("anchor", pa.list_(pa.string())),
        ("positive", pa.list_(pa.string())),
        ("cluster_id", pa.list_(pa.int64())),
    ]
)


@dataclass
class AnnotationCounts:
    documents: int = 0
    sentences: int = 0
    clusters: int = 0
    pairs: int = 0
    documents_without_pairs: int = 0
    capped_clusters: int = 0

    def add(self, other: AnnotationCounts) -> None:
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)


def counts_of(table: pa.Table) -> AnnotationCounts:
    """The counts of `DOCUMENT_ANNOTATION_SCHEMA` rows."""
    num_pairs = pc.list_value_length(table.column("anchor")).fill_null(0)
    return AnnotationCounts(
        documents=table.num_rows,
        sentences=int(pc.sum(table.column("num_sentences")).as_py() or 0),
        clusters=int(pc.sum(table.column("num_clusters")).as_py() or 0),
        pairs=int(pc.sum(num_pairs).as_py() or 0),
        documents_without_pairs=int(pc.sum(pc.equal(num_pairs, 0)).as_py() or 0),
        capped_clusters=int(pc.sum(table.column("capped_clusters")).as_py() or 0),
    )


def counts_table(table: pa.Table) -> pa.Table:
    """Per-batch counts as a one-row table (summed on the driver)."""
    return pa.Table.from_pylist([asdict(counts_of(table))])


def explode_pairs(table: pa.Table, round_index: int) -> pa.Table:
    """Per-document rows → one row per pair."""
    parents = pc.list_parent_indices(table.column("anchor"))  # (P,) row of each pair
    return pa.table(
        {
            "anchor": pc.list_flatten(table.column("anchor")),
            "positive": pc.list_flatten(table.column("positive")),
            "doc_id": pc.take(table.column("doc_id"), parents),
            "cluster_id": pc.list_flatten(table.column("cluster_id")),
            "round": pa.array(np.full(len(parents), round_index, dtype=np.int64)),
        },
        schema=PAIR_SCHEMA,
    )


def spread_keys(pairs: pa.Table, seed: int) -> np.ndarray:
    """A 64-bit key per pair from (seed, doc_id, anchor, positive) alone. Sorted by it, the
    pairs are in a seeded pseudo-random order that does not depend on which actor or batch
    produced them, and a document's pairs are spread over the whole round instead of sitting
    together: consecutive rows (a training batch) come from documents drawn at random."""
    import pandas as pd

    text = pc.binary_join_element_wise(
        pairs.column("doc_id"), pairs.column("anchor"), pairs.column("positive"), "\x1f"
    )
    hash_key = f"{seed:016x}"[-16:]  # siphash's 16-character key
    return pd.util.hash_array(np.asarray(text.to_pandas(), dtype=object), hash_key=hash_key)


def pairs_with_spread_key(table: pa.Table, round_index: int, seed: int) -> pa.Table:
    pairs = explode_pairs(table, round_index)
    return pairs.append_column(SPREAD_KEY, pa.array(spread_keys(pairs, seed), pa.uint64()))
