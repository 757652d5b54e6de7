"""Reading an embedding output directory: its manifest, its shards and its calibration.

The layout (written by the embed job, read by the index, search and mining):

    OUT/manifest.json                        written last: a present manifest is a finished
                                             run (format, model, dim, normalized, dtype, rows,
                                             shards [{file, first_id, rows}], dropped, corpus;
                                             optionally pooler, max_seq_length, prompts
                                             {query, document} (the embed job's settings),
                                             rows_as (document or query), row_prompt, and
                                             backend (torch, onnx, onnx_int8: absent is
                                             torch) with the graph and its agreement;
                                             compute_dtype (the torch model's number format,
                                             a list) with bfloat16's precision_check)
    OUT/shards/part-<first_id:012d>.parquet  id (int64), embedding (fixed_size_list of
                                             float32, int8, or uint8 bits for ubinary), text
                                             and document (optional); rows sorted by id
    OUT/calibration.npy                      int8 only: the (2, d) per-dimension [min, max]

OUT is a local path or any URI pyarrow.fs resolves (s3://, gs://). Every reader here checks
what it reads against the manifest and fails with a `ShardLayoutError` naming the file and
what is wrong with it, not with a shape error three calls later.

Vectors are compared by inner product on unit vectors (cosine) everywhere downstream:
:func:`unit_vectors` turns a shard's stored embeddings (float32, or int8 dequantised with the
calibration ranges) into those.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from distributed_emb.errors import UserInputError
from distributed_emb.model.onnx_config import BACKENDS
from distributed_emb.storage import filesystem_of, join

MANIFEST = "manifest.json"
CALIBRATION = "calibration.npy"
FORMAT = 1
DTYPES = ("float32", "int8", "ubinary")
ID, EMBEDDING, TEXT, DOCUMENT = "id", "embedding", "text", "document"
# What each stored dtype holds in the embedding list: (Arrow value type, values per vector).
_STORED = {
    "float32": (pa.float32(), lambda dim: dim),
    "int8": (pa.int8(), lambda dim: dim),
    "ubinary": (pa.uint8(), lambda dim: dim // 8),
}


class ShardLayoutError(UserInputError):
    """A manifest, shard or calibration file is missing or is not what the layout says; the
    message names the file."""


@dataclass(frozen=True)
class ShardEntry:
    """One shard as the manifest lists it."""

    file: str  # relative to OUT: "shards/part-000000000000.parquet"
    first_id: int
    rows: int


@dataclass(frozen=True)
class Manifest:
    """OUT/manifest.json, checked. `location` is OUT itself."""

    location: str
    model: str
    dim: int
    normalized: bool
    dtype: str
    rows: int
    shards: tuple[ShardEntry, ...]
    dropped: dict = field(default_factory=dict)
    corpus: tuple[str, ...] = ()
    # How the model embedded (optional keys): queries must be embedded the same way.
    pooler: str | None = None
    max_seq_length: int | None = None
    # The embed job's prompts.query (null: the model's own): how queries are to be embedded.
    query_prompt: str | None = None
    # How its rows were embedded: "document", "query" (embed.rows_as), None (not recorded).
    rows_as: str | None = None
    # What embedded them (embed.backend; outputs from before the setting: torch), the graph's
    # folder for an ONNX backend (relative: inside OUT) and its agreement with torch.
    backend: str = "torch"
    graph: str | None = None
    agreement: dict | None = None

    @property
    def path(self) -> str:
        return join(self.location, MANIFEST)

    def shard_location(self, number: int) -> str:
        return join(self.location, self.shards[number].file)


@dataclass
class Shard:
    """One shard's rows: `ids` (k,) int64, `embeddings` (k, width) as stored, and the optional
    columns that were asked for and exist (None otherwise)."""

    number: int  # its position in the manifest's shard list
    entry: ShardEntry
    ids: np.ndarray
    embeddings: np.ndarray | None = None
    text: np.ndarray | None = None  # (k,) object array of str
    document: np.ndarray | None = None  # (k,) int64


def read_manifest(out: str) -> Manifest:
    """OUT/manifest.json, checked: every key the layout names, the right types, and shard
    rows that add up. Raises ShardLayoutError naming the file and the key."""
    location = join(out, MANIFEST)
    what = "manifest (the embed job writes it last: a run that has not finished has none)"
    text = _read_bytes(location, what).decode("utf-8", errors="replace")
    try:
        tree = json.loads(text)
    except json.JSONDecodeError as error:
        raise ShardLayoutError(
            f"{location}: not valid JSON ({error.msg} at line {error.lineno})"
        ) from None
    if not isinstance(tree, dict):
        raise ShardLayoutError(f"{location}: the top level must be a JSON object")

    def value(key: str, kind: type, where: dict = tree, prefix: str = ""):
        if key not in where:
            raise ShardLayoutError(f"{location}: {prefix}{key}: missing")
        found = where[key]
        # bool is an int to Python: a count given as `true` is refused too.
        if not isinstance(found, kind) or (kind is int and isinstance(found, bool)):
            raise ShardLayoutError(
                f"{location}: {prefix}{key}: must be {kind.__name__}, got {found!r}"
            )
        return found

    if value("format", int) != FORMAT:
        raise ShardLayoutError(
            f"{location}: format: {tree['format']} is not a format this version reads ({FORMAT})"
        )
    dtype = value("dtype", str)
    if dtype not in DTYPES:
        raise ShardLayoutError(
            f"{location}: dtype: must be one of {', '.join(DTYPES)}, got {dtype!r}"
        )
    dim = value("dim", int)
    if dim < 1 or (dtype == "ubinary" and dim % 8):
        raise ShardLayoutError(f"{location}: dim: {dim} is not a vector size for dtype {dtype}")
    shards = []
    for number, item in enumerate(value("shards", list)):
        prefix = f"shards[{number}]."
        if not isinstance(item, dict):
            raise ShardLayoutError(f"{location}: shards[{number}]: must be an object, got {item!r}")
        entry = ShardEntry(
            file=value("file", str, item, prefix),
            first_id=value("first_id", int, item, prefix),
            rows=value("rows", int, item, prefix),
        )
        if entry.rows < 0:
            raise ShardLayoutError(f"{location}: {prefix}rows: must be >= 0, got {entry.rows}")
        shards.append(entry)
    rows = value("rows", int)
    if sum(entry.rows for entry in shards) != rows:
        raise ShardLayoutError(
            f"{location}: rows: {rows}, but the shards hold {sum(e.rows for e in shards)}"
        )
    corpus = tree.get("corpus", [])
    optional = {key: tree.get(key) for key in ("pooler", "max_seq_length")}
    if optional["pooler"] is not None:
        value("pooler", str)
    if optional["max_seq_length"] is not None:
        value("max_seq_length", int)
    prompts = tree.get("prompts")
    if prompts is not None:
        value("prompts", dict)
        if prompts.get("query") is not None:
            value("query", str, prompts, "prompts.")
        optional["query_prompt"] = prompts.get("query")
    if tree.get("rows_as") is not None:
        optional["rows_as"] = value("rows_as", str)
    if tree.get("backend") is not None:
        backend = optional["backend"] = value("backend", str)
        if backend not in BACKENDS:
            raise ShardLayoutError(
                f"{location}: backend: must be one of {', '.join(BACKENDS)}, got {backend!r}"
            )
        if backend != "torch":
            optional["graph"] = value("graph", str)
            optional["agreement"] = tree.get("agreement")
    return Manifest(
        location=str(out),
        model=value("model", str),
        dim=dim,
        normalized=value("normalized", bool),
        dtype=dtype,
        rows=rows,
        shards=tuple(shards),
        dropped=dict(tree.get("dropped") or {}),
        corpus=tuple(str(path) for path in corpus) if isinstance(corpus, list) else (),
        **optional,
    )


def shard_columns(manifest: Manifest) -> list[str]:
    """The columns the shards hold (from the first shard's schema; every shard of a run is
    written by the same job with the same columns)."""
    if not manifest.shards:
        return []
    location = manifest.shard_location(0)
    filesystem, path = filesystem_of(location)
    try:
        return pq.read_schema(path, filesystem=filesystem).names
    except FileNotFoundError:
        raise ShardLayoutError(f"{location}: missing (listed in {manifest.path})") from None
    except (pa.ArrowInvalid, OSError) as error:
        raise ShardLayoutError(f"{location}: not a readable Parquet file ({error})") from None


def read_shard(manifest: Manifest, number: int, columns: Sequence[str] = (ID, EMBEDDING)) -> Shard:
    """Shard `number` of the manifest: `columns` among id, embedding, text, document (id is
    always read). text and document are optional in the layout: asked for and absent, they
    come back None. Checked against the manifest: row count, embedding type and width, ids
    sorted and unique."""
    entry = manifest.shards[number]
    location = manifest.shard_location(number)
    filesystem, path = filesystem_of(location)
    wanted = [ID] + [c for c in columns if c != ID]
    try:
        present = pq.read_schema(path, filesystem=filesystem).names
        table = pq.read_table(
            path, columns=[c for c in wanted if c in present], filesystem=filesystem
        )
    except FileNotFoundError:
        raise ShardLayoutError(f"{location}: missing (listed in {manifest.path})") from None
    except (pa.ArrowInvalid, OSError) as error:
        raise ShardLayoutError(f"{location}: not a readable Parquet file ({error})") from None
    for required in (ID, EMBEDDING):
        if required in wanted and required not in present:
            raise ShardLayoutError(f"{location}: no {required!r} column (columns: {present})")
    if table.num_rows != entry.rows:
        raise ShardLayoutError(
            f"{location}: {table.num_rows} rows, but {manifest.path} lists {entry.rows}"
        )
    ids = _int64_column(table, ID, location)
    if len(ids) > 1 and not bool(np.all(ids[1:] > ids[:-1])):
        raise ShardLayoutError(f"{location}: ids are not sorted and unique")
    shard = Shard(number=number, entry=entry, ids=ids)
    if EMBEDDING in wanted:
        shard.embeddings = _embedding_column(table, manifest, location)
    if TEXT in wanted and TEXT in present:
        column = table.column(TEXT)
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            raise ShardLayoutError(f"{location}: text: must be strings, got {column.type}")
        shard.text = np.array(column.to_pylist(), dtype=object)
    if DOCUMENT in wanted and DOCUMENT in present:
        shard.document = _int64_column(table, DOCUMENT, location)
    return shard


def iter_shards(manifest: Manifest, columns: Sequence[str] = (ID, EMBEDDING)) -> Iterator[Shard]:
    """Every shard in manifest order, one at a time (a caller holds one shard's rows)."""
    for number in range(len(manifest.shards)):
        yield read_shard(manifest, number, columns)


def read_calibration(manifest: Manifest) -> np.ndarray:
    """OUT/calibration.npy: the (2, dim) float32 per-dimension [min, max] ranges of int8
    output."""
    location = join(manifest.location, CALIBRATION)
    data = _read_bytes(location, what=f"calibration ranges, though {manifest.path} says int8")
    try:
        ranges = np.load(io.BytesIO(data), allow_pickle=False)
    except ValueError as error:
        raise ShardLayoutError(f"{location}: not a numpy .npy file ({error})") from None
    if ranges.shape != (2, manifest.dim):
        raise ShardLayoutError(
            f"{location}: shape {ranges.shape}, expected (2, {manifest.dim}) for dim {manifest.dim}"
        )
    return ranges.astype(np.float32)


def dequantize_int8(values: np.ndarray, ranges: np.ndarray) -> np.ndarray:
    """(n, d) float32 from int8 `values`: the middle of each value's step. The inverse of
    sentence-transformers' quantize_embeddings, which floors (x − min) / step, step =
    (max − min) / 255, to 0…255 and subtracts 128."""
    starts = ranges[0]  # (d,)
    steps = (ranges[1] - starts) / 255
    steps = np.where(steps == 0, 1, steps)
    return (starts + (values.astype(np.float32) + 128.5) * steps).astype(np.float32)


def unit_vectors(shard: Shard, manifest: Manifest, ranges: np.ndarray | None = None) -> np.ndarray:
    """The shard's embeddings as (k, dim) float32 rows of length 1 (zero rows stay zero), the
    vectors every index and search compares by inner product.

    float32 written normalised is returned as stored, so an exact search reproduces the embed
    job's own scores; otherwise the rows are normalised here. int8 rows are dequantised with
    the calibration `ranges` (read from OUT when not given); ubinary rows become their ±1
    vectors (:func:`sign_vectors`)."""
    if shard.embeddings is None:
        raise ValueError(f"shard {shard.number} was read without its embeddings")
    if manifest.dtype == "ubinary":
        return sign_vectors(shard.embeddings, manifest.dim)
    if manifest.dtype == "int8":
        if ranges is None:
            ranges = read_calibration(manifest)
        return normalize_rows(dequantize_int8(shard.embeddings, ranges))
    if manifest.normalized:
        return np.ascontiguousarray(shard.embeddings, dtype=np.float32)
    return normalize_rows(shard.embeddings)


def sign_vectors(bits: np.ndarray, dim: int) -> np.ndarray:
    """(n, dim) float32 rows of ±1/√dim from (n, dim/8) packed ubinary rows (a set bit is +,
    as sentence-transformers' `quantize_embeddings` packs `embedding > 0`): a binary
    embedding as a unit vector. Its inner product with a unit float query is, up to the
    constant 1/√dim, the score sentence-transformers rescores binary hits with (the float
    query against the ±1 corpus vector), so it ranks them the same."""
    signs = np.unpackbits(np.asarray(bits, dtype=np.uint8), axis=1, count=dim)
    return (signs.astype(np.float32) * 2.0 - 1.0) / np.float32(np.sqrt(dim))


def normalize_rows(vectors: np.ndarray) -> np.ndarray:
    """(n, d) float32 rows scaled to length 1; a zero row stays zero. A copy: the caller's
    rows are left alone."""
    vectors = np.array(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)  # (n, 1)
    np.divide(vectors, norms, out=vectors, where=norms > 0)
    return vectors


# ---------------------------------------------------------------------------------------------


def _read_bytes(location: str, what: str) -> bytes:
    filesystem, path = filesystem_of(location)
    try:
        info = filesystem.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise ShardLayoutError(f"{location}: missing: no {what}")
        if info.type != pafs.FileType.File:
            raise ShardLayoutError(f"{location}: not a file")
        with filesystem.open_input_stream(path) as stream:
            return stream.read()
    except OSError as error:
        raise ShardLayoutError(f"{location}: cannot be read ({error})") from None


def _int64_column(table: pa.Table, name: str, location: str) -> np.ndarray:
    column = table.column(name)
    if not pa.types.is_integer(column.type):
        raise ShardLayoutError(f"{location}: {name}: must be int64, got {column.type}")
    if column.null_count:
        raise ShardLayoutError(f"{location}: {name}: {column.null_count} null values")
    return column.to_numpy().astype(np.int64, copy=False)


def _embedding_column(table: pa.Table, manifest: Manifest, location: str) -> np.ndarray:
    """(k, width) array of the embedding column, checked against the manifest's dtype/dim."""
    column = table.column(EMBEDDING)
    value_type, width_of = _STORED[manifest.dtype]
    width = width_of(manifest.dim)
    kind = column.type
    if (
        not pa.types.is_fixed_size_list(kind)
        or kind.list_size != width
        or kind.value_type != value_type
    ):
        raise ShardLayoutError(
            f"{location}: embedding: {kind}, but {manifest.path} says dtype {manifest.dtype} "
            f"and dim {manifest.dim} (fixed_size_list<{value_type}>[{width}])"
        )
    if column.null_count:
        raise ShardLayoutError(f"{location}: embedding: {column.null_count} null rows")
    array = column.combine_chunks()
    values = array.flatten().to_numpy(zero_copy_only=False)  # flatten honours a slice's offset
    return values.reshape(len(array), width)
