"""Sentence corpora and pair tables: which columns a row has, and the Ray Data stages that clean
them with exact drop counts.

The driver only lists the files (data/sources.py). Reading, parsing and cleaning run as Ray
Data tasks (data/readers.py, assembled in data/corpus_dataset.py) in the pass that writes the
corpus's indexed token shards (data/token_cache.py), so nothing of the corpus passes through
the driver.

A row's text columns are declared once, in `row_columns` (`corpus_columns` for a `data`
section): the reading rules, the cleaning, the token cache's key, the tokenising stage, the
length used for grouping and the collator all take them from there, so a new column (like
the mined hard `negative`, `data.negative_column`) is added here and nowhere else in data/.

Drop counts: each cleaning task counts its block's rows by reason and hands the counts to one
small actor (`DropCounter`) under the block's first row id. A block read again (the next
epoch, another worker's shard, a retried task) brings the same key and is counted once, so the
totals are exact for every row the run has read, however the corpus is cut into blocks.

De-duplication (`data.deduplicate`, off by default) is a distributed stage: rows are
hash-partitioned by their text so that every copy of a row lands in the same block, and each
block keeps the first copy. It is an all-to-all step: training then waits for one full pass
over the corpus (measured in docs/BENCHMARKS.md), which is why it is opt-in.
"""

from __future__ import annotations

import hashlib
import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from distributed_emb.data.data_config import DataConfig
from distributed_emb.data.readers import (
    DROP,
    ROW_ID,
    WHERE,
    DropReport,
    TextRows,
    iter_parsed_blocks,
)
from distributed_emb.data.sources import CorpusError, is_hub_name, is_remote, resolve_sources
from distributed_emb.paths import shipped_corpus
from distributed_emb.progress_report import counting_actor

log = logging.getLogger(__name__)

STREAM_BLOCK_BYTES = 4 * 1024**2

__all__ = ["CorpusError", "DropReport", "corpus_columns", "read_rows", "row_columns"]


def row_columns(
    kind: str,
    text_column: str = "text",
    anchor_column: str = "anchor",
    positive_column: str = "positive",
    negative_column: str | None = None,
) -> list[str]:
    """The text columns of a row, read, cleaned and tokenised alike, in the order the collator
    stacks them: the sentence (or the pair's anchor and positive), then the hard negative
    when there is one. A row missing any of them is dropped and counted (readers.TextRows)."""
    columns = [text_column] if kind == "sentences" else [anchor_column, positive_column]
    if negative_column is not None:
        columns.append(negative_column)
    return columns


def corpus_columns(data_config: DataConfig) -> list[str]:
    """`row_columns` of a `data` section."""
    return row_columns(
        data_config.kind,
        data_config.text_column,
        data_config.anchor_column,
        data_config.positive_column,
        data_config.negative_column,
    )


def text_rules(data_config: DataConfig) -> TextRows:
    return TextRows(corpus_columns(data_config), data_config.group_column, data_config.max_chars)


def corpus_path(data_config: DataConfig) -> str | list[str]:
    return data_config.path or shipped_corpus("wiki_sentences.txt")


# ---------------------------------------------------------------------------------------------
# Drop counting across Ray tasks
# ---------------------------------------------------------------------------------------------


class DropCounter:
    """Collects per-block drop counts; a block reported twice (re-read) counts once. It also
    counts every row the cleaning tasks saw, re-reads included (`rows_read`): what reading
    really cost."""

    def __init__(self):
        self._blocks: set[int] = set()
        self._report = DropReport()
        self._rows_read = 0

    def add(self, key: int, counts: dict) -> None:
        block = DropReport.from_dict(counts)
        if key >= 0:  # read blocks; de-duplication's corrections (negative keys) move rows
            self._rows_read += block.rows
        if key in self._blocks:
            return
        self._blocks.add(key)
        self._report.merge(block)

    def report(self) -> dict:
        return self._report.as_dict()

    def rows_read(self) -> int:
        return self._rows_read


def start_drop_counter():
    """The counter actor of one run, on the driver's node (`progress_report.counting_actor`:
    one on a lost worker node would fail every later block's count, and the restored run)."""
    from ray.data._internal.stats import get_or_create_stats_actor  # private

    # Ray Data's cluster-wide stats actor is detached and pinned to the node of whichever
    # process first runs a dataset: a Train worker, so a worker node that then never counts
    # as idle and is never scaled down (tests/cluster/test_elastic.py). Created here
    # first, it lives on the driver's node instead.
    get_or_create_stats_actor()
    return counting_actor(DropCounter)


def collect_report(counter) -> DropReport:
    import ray  # startup

    return DropReport.from_dict(ray.get(counter.report.remote()))


def rows_read(counter) -> int:
    """Rows the cleaning tasks have seen so far (re-reads included): a pass's progress."""
    import ray  # startup

    return int(ray.get(counter.rows_read.remote()))


class KeepCleanRows:
    """Ray Data stage: count a parsed block's rows by reason (sent to the DropCounter, when
    there is one) and pass on only the kept rows, with their row ids."""

    def __init__(self, counter):
        self.counter = counter

    def __call__(self, block: pa.Table) -> pa.Table:
        import ray  # startup

        # Columns only the count needs (DocumentRows adds `_blank_sentences`).
        bookkeeping = [c for c in (DROP, WHERE, "_blank_sentences") if c in block.column_names]
        if block.num_rows == 0:
            return block.drop_columns(bookkeeping)
        if self.counter is not None:
            report = DropReport.of_block(block)
            key = int(pc.min(block.column(ROW_ID)).as_py())
            ray.get(self.counter.add.remote(key, report.as_dict()))
        kept = block.filter(pc.equal(block.column(DROP), ""))
        return kept.drop_columns(bookkeeping)


def _text_key(block: pa.Table, columns: list[str]) -> np.ndarray:
    """A 64-bit hash of each row's text columns (exact duplicates collide, others not)."""
    values = zip(*(block.column(c).to_pylist() for c in columns))
    digests = [hashlib.blake2b("\x1f".join(v).encode(), digest_size=8).digest() for v in values]
    return np.frombuffer(b"".join(digests), dtype=np.int64) if digests else np.zeros(0, np.int64)


def _with_text_key(block: pa.Table, columns: list[str]) -> pa.Table:
    return block.append_column("_text_key", pa.array(_text_key(block, columns)))


class KeepFirstCopies:
    """After hash-partitioning by text: keep each text's first copy (lowest row id), count the
    rest as `duplicate` under the block's first row id (stable across re-execution)."""

    def __init__(self, counter):
        self.counter = counter

    def __call__(self, block: pa.Table) -> pa.Table:
        import ray  # startup

        if block.num_rows == 0:
            return block.drop_columns(["_text_key"])
        order = np.lexsort((block.column(ROW_ID).to_numpy(), block.column("_text_key").to_numpy()))
        keys = block.column("_text_key").to_numpy()[order]
        first = np.ones(len(keys), dtype=bool)
        first[1:] = keys[1:] != keys[:-1]
        duplicates = int((~first).sum())
        if duplicates:
            # Already read and kept by KeepCleanRows: a duplicate moves from kept to dropped.
            report = DropReport(kept=-duplicates, dropped={"duplicate": duplicates})
            key = -1 - int(block.column(ROW_ID).to_numpy().min())  # apart from read-block keys
            ray.get(self.counter.add.remote(key, report.as_dict()))
        kept = block.take(pa.array(np.sort(order[first])))
        return kept.drop_columns(["_text_key"])


SMALL_CORPUS_BYTES = 64 * 1024**2


def listed_and_small(specs: list[str], hf_split: str) -> bool:
    """Lists the sources (a listing, no rows: a missing bucket or file, an unreachable hub or a
    source without a data file fails here, named); True when every one is local and together
    they are small enough to read on the driver in a second or two (SMALL_CORPUS_BYTES)."""
    files = resolve_sources(specs, hf_split)
    if any(is_remote(spec) or is_hub_name(spec) for spec in specs):
        return False
    return files.total_bytes <= SMALL_CORPUS_BYTES


def check_small_corpus(data: DataConfig, step_rows: int | None = None, step: str = "") -> None:
    """Every corpus is listed before Ray starts, and a local one small enough to count in a
    second or two is counted, so one that cannot fill a single step of `step_rows` rows (`step`
    says how the settings make them) fails at once instead of inside the Train workers. Larger
    or remote corpora are not read here (no driver pass): the workers' loop says the same if
    the stream runs dry before the first step. `step_rows` None (a search whose batch size is
    searched): read, not counted."""
    path = corpus_path(data)
    specs = [path] if isinstance(path, str) else list(path)
    if not listed_and_small(specs, data.hf_split):
        return
    rules = text_rules(data)
    rows, report = read_rows(
        specs, rules.columns, rules.group_column, data.hf_split, data.deduplicate,
        data.max_rows, data.max_chars,
    )  # fmt: skip
    if step_rows is None:
        return
    kept = len(rows[rules.fields[0]])
    if kept < step_rows:
        raise CorpusError(
            f"{path}: {kept} usable rows cannot fill one step of {step_rows} ({step}); "
            f"{report.summary()}"
        )


# ---------------------------------------------------------------------------------------------
# The same rows in this process (no Ray): the reference for tests and for small inputs
# ---------------------------------------------------------------------------------------------


def read_rows(
    path: str | list[str],
    columns: list[str] | None = None,
    group_column: str | None = None,
    hf_split: str = "train",
    deduplicate: bool = False,
    max_rows: int | None = None,
    max_chars: int = 20_000,
) -> tuple[dict[str, list[str]], DropReport]:
    """Clean rows of `columns` in file order, plus the drop report, read in this process.

    Same files, rules and counts as the Ray path (data/corpus_dataset.py `training_dataset`); for
    inputs small enough for one process (MCR² pair tables, tests)."""
    rules = TextRows(columns or ["text"], group_column, max_chars)
    report = DropReport()
    kept: dict[str, list[str]] = {name: [] for name in rules.fields}
    seen: set[tuple] = set()
    for block in iter_parsed_blocks(resolve_sources(path, hf_split), rules):
        report.merge(DropReport.of_block(block))
        for values in (
            block.filter(pc.equal(block.column(DROP), "")).select(rules.fields).to_pylist()
        ):
            key = tuple(values[name] for name in rules.fields)
            if deduplicate and key in seen:
                report.kept -= 1  # counted as read and kept above: it moves to dropped
                report.dropped["duplicate"] = report.dropped.get("duplicate", 0) + 1
                continue
            seen.add(key)
            if max_rows is not None and len(kept[rules.fields[0]]) >= max_rows:
                break
            for name in rules.fields:
                kept[name].append(values[name])
    if not kept[rules.fields[0]]:
        raise CorpusError(f"{path}: no usable rows ({report.summary()})")
    return kept, report
