"""One epoch's order over a corpus of indexed shards, as a pure function of the corpus's row
count, the seed and the epoch, read a window at a time.

A corpus whose shards are indexed (rows per shard known up front, any row readable by its id)
does not have to be read in file order. The epoch's order:

1. cuts the corpus (its shards end to end, global row ids 0 … N-1) into spans of `span_rows`
   rows (the last span may be shorter; a span may run from one shard into the next);
2. permutes all spans with a generator seeded by (seed, epoch): a single large shard is
   shuffled over its whole length, and spans of different shards interleave;
3. groups the permuted spans into consecutive windows of `window_rows // span_rows` spans;
4. shuffles the rows inside each window with a generator seeded by (seed, epoch, window).

The spans ignore where the shards end on purpose: the rows are in corpus order whoever built
the shards, but the cut into files is not fixed (Ray Data's sort draws its partition bounds
from a random sample, so two builds of one corpus cut it into different files). An order that
depended on the cut would train a rebuilt corpus, or one run against another, on other
batches.

A window's rows come from about `window_rows / span_rows` spans spread over the whole corpus,
so a batch mixes shards about as well as a uniform permutation does (MosaicML Streaming's
py1e shuffle, by contrast, moves rows at most about one block from their shard's place:
bench/shuffle_quality.py compares the three). Rows of the epoch at positions [start, stop)
need only the windows that overlap them: memory is O(window rows + spans) wherever `start` is,
so resuming deep into a 10M-row shard costs what starting it does.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

SPAN_ROWS = 1024  # rows of a span: the unit the order permutes (the corpus is cut into spans)
WINDOW_ROWS = 1 << 18  # rows of a shuffle window (py1e's default block size is 2**18)

# The third word of each generator's seed, so the span permutation and the window shuffles
# never draw from the same stream.
_SPANS = 0
_WINDOW = 1


@dataclass(frozen=True)
class ShardOrder:
    """One epoch's order over shards of `shard_rows` rows (global row id = rows of the shards
    before + offset in shard); only their total decides the order. `seed` None: corpus order,
    no shuffle."""

    shard_rows: tuple[int, ...]
    seed: int | None
    epoch: int
    span_rows: int = SPAN_ROWS
    window_rows: int = WINDOW_ROWS

    def __post_init__(self) -> None:
        # Plain ints, whatever the caller built them from (numpy integers, a list), so the
        # order hashes, compares and fingerprints (as JSON) the same way.
        object.__setattr__(self, "shard_rows", tuple(int(rows) for rows in self.shard_rows))
        for name in ("seed", "epoch", "span_rows", "window_rows"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, int(getattr(self, name)))
        for shard, rows in enumerate(self.shard_rows):
            if rows < 0:
                raise ValueError(f"ShardOrder: shard {shard} has {rows} rows (must be >= 0)")
        for name in ("span_rows", "window_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"ShardOrder: {name} = {getattr(self, name)} (must be >= 1)")
        if self.epoch < 0:
            raise ValueError(f"ShardOrder: epoch = {self.epoch} (must be >= 0)")
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"ShardOrder: seed = {self.seed} (must be >= 0, or None)")

    @cached_property
    def total(self) -> int:
        return sum(self.shard_rows)

    @property
    def spans_per_window(self) -> int:
        return max(1, self.window_rows // self.span_rows)

    def rows(self, start: int, stop: int) -> np.ndarray:
        """int64 global row ids at epoch positions [start, stop)."""
        if not 0 <= start <= stop <= self.total:
            raise ValueError(f"ShardOrder.rows({start}, {stop}): outside [0, {self.total}]")
        if self.seed is None or start == stop:
            return np.arange(start, stop, dtype=np.int64)
        bounds = self._window_bounds
        first = int(np.searchsorted(bounds, start, side="right")) - 1
        pieces = []
        for window in range(first, int(np.searchsorted(bounds, stop, side="left"))):
            begin = int(bounds[window])
            pieces.append(self._window(window)[max(start, begin) - begin : stop - begin])
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)

    @cached_property
    def _spans(self) -> tuple[np.ndarray, np.ndarray]:
        """(first global row id, rows) of every span, in the epoch's span order."""
        starts = np.arange(0, self.total, self.span_rows, dtype=np.int64)
        lengths = np.minimum(self.span_rows, self.total - starts)
        order = np.random.default_rng([self.seed, self.epoch, _SPANS]).permutation(len(starts))
        return starts[order], lengths[order]

    @cached_property
    def _window_bounds(self) -> np.ndarray:
        """Epoch position where each window starts, and the total after the last."""
        _, lengths = self._spans
        ends = np.concatenate([[0], np.cumsum(lengths)])
        firsts = np.arange(0, len(lengths), self.spans_per_window)
        return np.concatenate([ends[firsts], [ends[-1]]]).astype(np.int64)

    @cached_property
    def _last_window(self) -> dict[int, np.ndarray]:
        """The window materialised last: a caller asks for consecutive small ranges (a batch
        at a time), which mostly fall in the same window."""
        return {}

    def _window(self, window: int) -> np.ndarray:
        """The global row ids of window `window`, in the epoch's order."""
        cache = self._last_window
        if window not in cache:
            starts, lengths = self._spans
            chosen = slice(window * self.spans_per_window, (window + 1) * self.spans_per_window)
            starts, lengths = starts[chosen], lengths[chosen]
            # Each span's rows in turn: its start plus 0, 1, … its length - 1.
            before = np.cumsum(lengths) - lengths
            ids = np.repeat(starts - before, lengths) + np.arange(int(lengths.sum()))
            np.random.default_rng([self.seed, self.epoch, _WINDOW, window]).shuffle(ids)
            cache.clear()
            cache[window] = ids
        return cache[window]
