"""Indexed shards: the prepared corpus a rank reads its own rows from, by row number.

A prepared corpus (the token cache's build, data/token_cache.py) is a directory of Arrow IPC
files (`*.arrow`, uncompressed, written by Ray Data tasks through `IpcShardSink`) and an index:
each shard's name and row count, in order. Global row g is row g − start(s) of the shard s
whose range holds it. Everything a rank needs to find a row is that index (a few bytes per
shard); no process hands rows to another.

Why Arrow IPC files rather than MosaicML's MDS or Parquet:
- Random access by row at O(1): an uncompressed IPC file is memory-mapped and a `take` of
  some rows touches only those rows' bytes (offsets and values of their token-id lists), at
  the start of a 10M-row shard or at its end. MDS gets the same from its per-sample offset
  table; Parquet cannot (a row costs decoding its whole row group, and a global shuffle
  touches every row group many times over).
- Columnar and typed: token ids stay `list<int32>` arrays that become the collator's matrix
  without a per-row decode (MDS stores each sample as its own encoded bytes); the files open
  in pyarrow, polars or DuckDB for inspection.
- What MDS has that this does not: compression per shard. Token ids are ~4 bytes a token; a
  corpus of 100M sentences at 30 tokens is ~12 GB on disk.

Where the shards live: the index's directory, local or any pyarrow filesystem (s3://, gs://).
A local directory is memory-mapped in place. A remote shard is copied whole, once, into the
node's cache directory (`ShardReader.cache_dir`, atomically: a copy is visible only when
complete) the first time a rank on that node needs one of its rows, then memory-mapped there:
ranks on one node share the copy and the page cache, as MosaicML Streaming's local cache
does. A global shuffle touches every shard early in each epoch, so each node holds the
whole prepared corpus on its local disk.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
from ray.data.datasource import BlockBasedFileDatasink

from distributed_emb.errors import UserInputError
from distributed_emb.storage import filesystem_of, join

SHARD_SUFFIX = ".arrow"
LENGTH = "_length"  # int32: a row's length for grouping (token ids; pairs: the longer side)
ROWS_KEY = b"distributed_emb.rows"  # each shard's row count, in its schema's metadata
RECORD_BATCH_ROWS = 1 << 20  # rows per IPC record batch: a shard of ~100k rows is one


class ShardIndexError(UserInputError):
    """A prepared directory whose shards are missing, unreadable or not what its index says."""


class IpcShardSink(BlockBasedFileDatasink):
    """Ray Data's writer of one Arrow IPC file per write task (`min_rows_per_file` rows at
    least), its row count in the schema metadata so the index is built from the files'
    footers alone."""

    def __init__(self, path: str, filesystem: pafs.FileSystem, min_rows_per_file: int):
        super().__init__(
            path, filesystem=filesystem, file_format="arrow", min_rows_per_file=min_rows_per_file
        )

    def write_block_to_file(self, block, file) -> None:
        write_shard(block.to_arrow(), file)


def write_shard(table: pa.Table, file) -> None:
    """One shard: `table` as an uncompressed Arrow IPC file (a path or a writable file), its
    row count in the schema metadata."""
    metadata = dict(table.schema.metadata or {})
    metadata[ROWS_KEY] = str(table.num_rows).encode()
    # One record batch per RECORD_BATCH_ROWS rows, however many chunks the table arrived in:
    # a reader takes rows batch by batch.
    table = table.replace_schema_metadata(metadata).combine_chunks()
    with pa.ipc.new_file(file, table.schema) as writer:
        writer.write_table(table, max_chunksize=RECORD_BATCH_ROWS)


@dataclass(frozen=True)
class ShardIndex:
    """The shards of a prepared corpus, in order: (name, rows) each, under `directory`."""

    directory: str
    shards: tuple[tuple[str, int], ...]

    @property
    def rows(self) -> int:
        return sum(rows for _, rows in self.shards)

    @property
    def shard_rows(self) -> tuple[int, ...]:
        return tuple(rows for _, rows in self.shards)

    @property
    def fingerprint(self) -> str:
        """What decides which row a global row number is: the shards' names and sizes in
        order (not the directory: a copied corpus is the same corpus)."""
        text = ";".join(f"{name}:{rows}" for name, rows in self.shards)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def as_list(self) -> list[list]:
        return [[name, rows] for name, rows in self.shards]

    @classmethod
    def from_list(cls, directory: str, shards: list) -> ShardIndex:
        return cls(directory, tuple((str(name), int(rows)) for name, rows in shards))

    @classmethod
    def scan(cls, directory: str) -> ShardIndex:
        """The index of the shards written under `directory` (names sorted; each shard's
        footer read for its row count: one small ranged read per shard on object storage)."""
        filesystem, path = filesystem_of(directory)
        infos = filesystem.get_file_info(pafs.FileSelector(path))
        names = sorted(
            info.base_name
            for info in infos
            if info.type == pafs.FileType.File and info.base_name.endswith(SHARD_SUFFIX)
        )
        shards = []
        for name in names:
            location = join(directory, name)
            try:
                with filesystem.open_input_file(join(path, name)) as handle:
                    metadata = pa.ipc.open_file(handle).schema.metadata or {}
                shards.append((name, int(metadata[ROWS_KEY])))
            except (pa.ArrowInvalid, KeyError, ValueError) as error:
                raise ShardIndexError(
                    f"{location}: not a shard written by distributed_emb ({error})"
                ) from error
        return cls(directory, tuple(shards))


@dataclass
class ShardReader:
    """Rows of an indexed corpus by global row number, in the order asked (see the module
    docstring for where the bytes come from). One per process; thread-safe for reading.
    `rows_taken`: rows whose columns this reader materialised (what a rank read)."""

    index: ShardIndex
    cache_dir: str | None = None  # remote shards' node-local copies (None: the temp dir)
    rows_taken: int = 0
    _opened: dict = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self):
        self._starts = np.concatenate([[0], np.cumsum(self.index.shard_rows)]).astype(np.int64)

    def take(self, rows: np.ndarray, columns: list[str] | None = None) -> pa.Table:
        """The rows with global numbers `rows` (int64), in that order; `columns`: only those
        (None: all). Each record batch a row
        falls in is taken from directly: a take on a many-chunk table would first copy the
        whole shard into one chunk (5 ms a call for a 125k-row shard, against 0.04 ms)."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= self._starts[-1]):
            raise IndexError(f"rows outside [0, {self._starts[-1]}) of {self.index.directory}")
        wanted = columns
        shard_of = np.searchsorted(self._starts, rows, side="right") - 1
        order = np.argsort(shard_of, kind="stable")
        parts = []
        for shard in np.unique(shard_of):
            members = order[shard_of[order] == shard]
            offsets = rows[members] - self._starts[shard]
            batches, batch_starts = self._batches(int(shard))
            batch_of = np.searchsorted(batch_starts, offsets, side="right") - 1
            for batch in np.unique(batch_of):
                chosen = offsets[batch_of == batch] - batch_starts[batch]
                piece = batches[batch]
                if wanted is not None:
                    piece = piece.select(wanted)
                parts.append((members[batch_of == batch], piece.take(pa.array(chosen))))
        with self._lock:
            self.rows_taken += len(rows)
        if not parts:  # nothing asked: no row, the shards' columns
            schema = self._batches(0)[0][0].schema
            empty = pa.Table.from_batches([], schema)
            return empty.select(wanted) if wanted is not None else empty
        merged = pa.Table.from_batches([piece for _, piece in parts]).combine_chunks()
        # Back to the order asked: the pieces listed the rows batch by batch.
        placed = np.concatenate([positions for positions, _ in parts])
        inverse = np.empty(len(rows), dtype=np.int64)
        inverse[placed] = np.arange(len(rows))
        return merged.take(pa.array(inverse))

    def _batches(self, shard: int) -> tuple[list[pa.RecordBatch], np.ndarray]:
        """A shard's record batches (memory-mapped) and the shard row each starts at."""
        opened = self._opened.get(shard)
        if opened is None:
            with self._lock:
                opened = self._opened.get(shard)
                if opened is None:
                    opened = self._opened[shard] = self._open(shard)
        return opened

    def _open(self, shard: int) -> tuple[list[pa.RecordBatch], np.ndarray]:
        name, rows = self.index.shards[shard]
        location = join(self.index.directory, name)
        local = location if "://" not in location else self._local_copy(location)
        try:
            reader = pa.ipc.open_file(pa.memory_map(local))  # zero-copy: mapped, not read
            batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        except (OSError, pa.ArrowInvalid) as error:
            raise ShardIndexError(f"{location}: cannot read the shard ({error})") from error
        sizes = [batch.num_rows for batch in batches]
        if sum(sizes) != rows:
            raise ShardIndexError(
                f"{location}: {sum(sizes)} rows, the index says {rows}: the directory was "
                f"changed after it was indexed"
            )
        return batches, np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)

    def _local_copy(self, location: str) -> str:
        """The node's copy of a remote shard, made once (atomic rename: never half a file)."""
        root = Path(self.cache_dir or Path(tempfile.gettempdir()) / "distributed_emb_shards")
        digest = hashlib.sha256(location.encode()).hexdigest()[:16]
        target = root / f"{digest}{SHARD_SUFFIX}"
        if target.exists():
            return str(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f"{target.name}.{uuid.uuid4().hex[:8]}.partial")
        filesystem, path = filesystem_of(location)
        try:
            with filesystem.open_input_stream(path) as source, open(partial, "wb") as sink:
                while chunk := source.read(1 << 24):
                    sink.write(chunk)
            os.replace(partial, target)
        except OSError as error:
            partial.unlink(missing_ok=True)
            raise ShardIndexError(
                f"{location}: cannot copy the shard to {target} ({error})"
            ) from error
        return str(target)
