"""Pair utilities between InfoCSE rounds: reading pairs and the overlap of two rounds.

- :func:`pair_overlap`: how many of this round's positives the previous round already had.
  A pair is unordered and compared by text: (a, b) and (b, a) are the same pair.
  :func:`pair_overlap` is the single-process reference over rows in memory;
  :func:`pair_overlap_on_cluster` computes the same counts with Ray Data from the rounds'
  Parquet shards, so the driver never holds the pairs (only three integers come back).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa


def read_pairs(path: str) -> list[dict]:
    """Pairs written by the annotator (a Parquet file or a directory of them, local or on
    object storage), in file order, as rows in this process: for references and tests."""
    import pyarrow.dataset as pads
    import pyarrow.fs as pafs

    if "://" in path:
        filesystem, inner = pafs.FileSystem.from_uri(path)
    else:
        filesystem, inner = pafs.LocalFileSystem(), str(Path(path).resolve())
    info = filesystem.get_file_info(inner)
    if info.type == pafs.FileType.File:
        files = [inner]
    else:
        selector = pafs.FileSelector(inner, recursive=True, allow_not_found=True)
        files = sorted(i.path for i in filesystem.get_file_info(selector)
                       if i.path.endswith(".parquet"))  # fmt: skip
    if not files:
        raise FileNotFoundError(f"no Parquet pair files at {path}")
    table = pads.dataset(files, format="parquet", filesystem=filesystem).to_table()
    return table.to_pylist()


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


KEY = "pair_key"


def pair_keys(table: pa.Table) -> pa.Table:
    """One 64-bit key per unordered pair of texts ((a, b) and (b, a) alike), as a one-column
    table. Two distinct pairs share a key with probability about n²/2⁶⁵ (n pairs): under
    10⁻⁶ below 6 million pairs a round."""
    import pandas as pd
    import pyarrow.compute as pc

    anchor, positive = table.column("anchor"), table.column("positive")
    first = pc.if_else(pc.less_equal(anchor, positive), anchor, positive)
    second = pc.if_else(pc.less_equal(anchor, positive), positive, anchor)
    text = pc.binary_join_element_wise(first, second, "\x1f").to_pandas()
    keys = pd.util.hash_array(np.asarray(text, dtype=object))
    return pa.table({KEY: pa.array(keys, pa.uint64())})


def pair_overlap_on_cluster(previous: str, current: str) -> PairOverlap:
    """:func:`pair_overlap` of two rounds' Parquet pairs, computed by Ray Data tasks: each
    round's distinct keys (a hash shuffle), then the keys both rounds hold. The driver gets
    three counts, whatever the number of pairs."""
    import ray

    rounds = [
        ray.data.read_parquet(where, columns=["anchor", "positive"])
        for where in (previous, current)
    ]
    # One hash partition per ~2M keys (16 MB of them): Ray Data's default of 200 partitions
    # costs seconds of task start-up on small rounds. The counts come from Parquet metadata.
    partitions = max(1, math.ceil(sum(r.count() for r in rounds) / 2_000_000))

    def distinct(pairs):
        keys = pairs.map_batches(pair_keys, batch_format="pyarrow")
        return (
            keys.groupby(KEY, num_partitions=partitions).count().select_columns([KEY]).materialize()
        )

    before, after = (distinct(pairs) for pairs in rounds)
    both = before.union(after).groupby(KEY, num_partitions=partitions).count()
    both = both.rename_columns({"count()": "rounds"})
    common = both.filter(expr="rounds == 2").count()
    return PairOverlap(previous=before.count(), current=after.count(), common=common)
