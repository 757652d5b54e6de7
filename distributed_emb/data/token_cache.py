"""Tokenised shards, written once and reused: every training corpus as token ids on the storage
path, the one form a run trains from.

Every run reads its corpus through here: the driver runs one Ray Data pass over the clean
corpus (data/corpus_dataset.py: read → clean, then tokenise, data/tokenize.py, on every CPU
the cluster has before the Train workers start) and writes the token ids as indexed shards;
each rank then reads its own rows of them (data/rank_batches.py), and every later run with
the same key (later epochs, a resumed run, each trial of a Tune search) reads the same shards
without tokenising again. The pass costs one read and tokenisation of the corpus: 5.7 s for
the shipped 17,891 sentences on 2 cores, about 5 s for a test's few hundred lines (Ray Data's
start-up is most of it; docs/OPERATIONS.md); it also counts the corpus, so the schedule never
needs a pass of its own.

Layout, under `data.token_cache_dir` (default: `<run storage path>/token_cache`), local or any
pyarrow filesystem URI (s3://, gs://):

    <root>/<key id>/key.json          what the key was made of (for people; not read back)
    <root>/<key id>/data-<uuid>/      the Arrow IPC shards of one build (data/indexed_shards.py)
    <root>/<key id>/COMMIT.json       written last: which data-<uuid> is whole, its index
                                      (each shard's name and rows), its row count and the
                                      corpus drop counts of the pass that made it

Each rank reads its own rows from the shards by row number (data/rank_batches.py); a row's
`_length` (its token count; pairs and rows with a hard negative: its longest text) is stored
beside its ids so length grouping reads 4 bytes a row, not the ids.

The key id is a hash of everything that decides the ids: the corpus files (paths, sizes,
modification times), the cleaning rules (the text columns, `data.negative_column` among them;
kind, max_chars, de-duplication, max_rows, split), the tokenizer (its name and a hash of its
whole definition: vocabulary, normaliser, special tokens) and the maximum length, plus the
cache's format version. Anything else (batch size, shuffling, workers) is applied when the
shards are read.

Crash safety: shards are written under a fresh `data-<uuid>` name and only a COMMIT.json that
names them makes them visible (an atomic rename locally; a single object PUT on object stores,
which becomes visible whole or not at all). A writer that dies leaves an unnamed `data-*`
directory that no run reads. Two runs that build the same key at once each write their own
directory; the last commit wins and both are whole.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs
from transformers import AutoTokenizer

from distributed_emb.data.corpus import (
    collect_report,
    corpus_columns,
    corpus_path,
    rows_read,
    start_drop_counter,
)
from distributed_emb.data.corpus_dataset import training_dataset
from distributed_emb.data.data_config import DataConfig
from distributed_emb.data.epoch_plan import length_of_rows
from distributed_emb.data.indexed_shards import LENGTH, IpcShardSink, ShardIndex
from distributed_emb.data.readers import DropReport
from distributed_emb.data.sources import resolve_sources
from distributed_emb.data.stream_settings import StreamSettings
from distributed_emb.data.tokenize import tokenize_arguments
from distributed_emb.errors import UserInputError
from distributed_emb.progress_report import polled_progress
from distributed_emb.storage import filesystem_of, join, read_text, write_text

log = logging.getLogger(__name__)

# Bump when the shards' content for the same key changes (cleaning or tokenising code).
# 2: Arrow IPC shards with an index and a _length column; 3: de-duplicated corpora in corpus
# order (data/corpus_dataset.py), not the de-duplication's hash order.
CACHE_FORMAT = 3
COMMIT_FILE = "COMMIT.json"
KEY_FILE = "key.json"
DATA_PREFIX = "data-"
ROWS_PER_FILE = 100_000  # ~12 MB of ids at 30 tokens a row: few files, still many blocks


class TokenCacheError(UserInputError):
    """A cache directory holds something that is not a committed cache of this key."""


@dataclass
class TokenShards:
    """One committed build of the cache: its shards' index and what the build counted."""

    index: ShardIndex  # the data-<uuid> directory (a local path or a URI) and its shards
    report: DropReport
    built: bool  # True: this process tokenised the corpus; False: reused

    @property
    def directory(self) -> str:
        return self.index.directory

    @property
    def rows(self) -> int:
        return self.index.rows


# Settings the cached ids depend on (cache_key), all of data.* included: a search that varies
# one of them cannot share one build among its trials (each trial builds or reuses its own).
KEY_SETTINGS = ("model.path", "model.max_seq_length", "model.trust_remote_code", "data.")


def searched_key_settings(space) -> list[str]:
    """The searched keys (dotted) that change the cached ids."""
    return [key for key in space if key.startswith(KEY_SETTINGS)]


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of everything that decides a tokenizer's ids: the whole fast-tokenizer definition
    (vocabulary, merges, normaliser, pre-tokeniser, post-processor, added tokens), or a slow
    tokenizer's vocabulary and special tokens. Truncation and padding state are left out: they
    are per call (the cache key has the maximum length)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        definition = json.loads(backend.to_str())
        definition.pop("truncation", None)
        definition.pop("padding", None)
    else:
        definition = {
            "vocab": sorted(tokenizer.get_vocab().items()),
            "special": {k: str(v) for k, v in sorted(tokenizer.special_tokens_map.items())},
        }
    definition["class"] = type(tokenizer).__name__
    text = json.dumps(definition, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def corpus_fingerprint(data_config: DataConfig) -> list[list]:
    """[path, size, modification time in ns] of every corpus file, in reading order. The
    listing is names and metadata only (no contents), as for reading."""
    return sources_fingerprint(corpus_path(data_config), data_config.hf_split)


def sources_fingerprint(specs: str | list[str], hf_split: str = "train") -> list[list]:
    """:func:`corpus_fingerprint` of any sources (a document corpus's too)."""
    files = resolve_sources(specs, hf_split)
    mtimes: dict[str, int | None] = {}
    by_filesystem: dict[int, tuple[pafs.FileSystem, list[str]]] = {}
    for file, filesystem in zip(files.files, files.filesystems):
        by_filesystem.setdefault(id(filesystem), (filesystem, []))[1].append(file.path)
    for filesystem, paths in by_filesystem.values():
        for info in filesystem.get_file_info(paths):
            mtimes[info.path] = info.mtime_ns
    return [[f.path, f.size, mtimes.get(f.path)] for f in files.files]


def cache_key(data: DataConfig, stream: StreamSettings) -> dict:
    """Everything the cached ids depend on (see the module docstring)."""
    tokenizer = AutoTokenizer.from_pretrained(
        stream.tokenizer, trust_remote_code=stream.trust_remote_code
    )
    return {
        "format": CACHE_FORMAT,
        "corpus": corpus_fingerprint(data),
        "cleaning": {
            "kind": data.kind,
            "columns": corpus_columns(data),
            "group_column": data.group_column,
            "hf_split": data.hf_split,
            "max_chars": data.max_chars,
            "deduplicate": data.deduplicate,
            "max_rows": data.max_rows,
        },
        "tokenizer": {"name": stream.tokenizer, "sha256": tokenizer_fingerprint(tokenizer)},
        "max_seq_length": stream.max_seq_length,
    }


def key_id(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]


def committed_shards(directory: str) -> TokenShards | None:
    """The committed build in one key's directory, or None when there is none yet."""
    commit_path = join(directory, COMMIT_FILE)
    text = read_text(commit_path)
    if text is None:
        return None
    try:
        commit = json.loads(text)
        data = commit["data"]
        shards = commit["shards"]
        report = DropReport.from_dict(commit["corpus"])
        if not data.startswith(DATA_PREFIX) or "/" in data:
            raise ValueError(f"'data' must name a {DATA_PREFIX}* directory, got {data!r}")
        index = ShardIndex.from_list(join(directory, data), shards)
    except (ValueError, KeyError, TypeError) as error:
        raise TokenCacheError(
            f"{commit_path}: not a token-cache commit ({error}); delete {directory} to rebuild"
        ) from error
    return TokenShards(index, report, built=False)


def _with_length(table: pa.Table, columns: tuple[str, ...]) -> pa.Table:
    """The rows with their `_length` for length grouping (data/rank_batches.py)."""
    return table.append_column(LENGTH, pa.array(length_of_rows(table, columns), pa.int32()))


def build_shards(
    data: DataConfig, stream: StreamSettings, directory: str, key: dict
) -> TokenShards:
    """One Ray Data pass: read → clean → tokenise → indexed shards under a fresh name, then
    commit (the index is read from the shards' footers)."""
    stage = tokenize_arguments(data, stream)
    name = f"{DATA_PREFIX}{uuid.uuid4().hex[:12]}"
    target = join(directory, name)
    filesystem, path = filesystem_of(target)
    filesystem.create_dir(path, recursive=True)
    write_text(join(directory, KEY_FILE), json.dumps(key, indent=1))
    started = time.perf_counter()
    counter = start_drop_counter()
    dataset = training_dataset(data, counter)
    dataset = dataset.map_batches(stage.pop("fn"), **stage)
    dataset = dataset.map_batches(
        _with_length,
        fn_kwargs={"columns": tuple(corpus_columns(data))},
        batch_size=None,
        batch_format="pyarrow",
    )
    try:
        # Off a terminal (ray job logs, CI) a line a minute from the cleaning tasks' count;
        # the corpus's row count is known only once read (no driver pass), unless max_rows.
        with polled_progress(
            "token cache: rows read", data.max_rows, "rows", lambda: rows_read(counter)
        ):
            dataset.write_datasink(IpcShardSink(path, filesystem, ROWS_PER_FILE))
        index = ShardIndex.scan(target)
    except BaseException:
        filesystem.delete_dir(path)  # never committed: no run would read it anyway
        raise
    report = collect_report(counter)
    commit = {
        "data": name,
        "rows": index.rows,
        "shards": index.as_list(),
        "corpus": report.as_dict(),
        "key_id": key_id(key),
    }
    write_text(join(directory, COMMIT_FILE), json.dumps(commit, indent=1))
    log.info(
        "token cache: tokenised %d rows in %.1f s into %d shards under %s", index.rows,
        time.perf_counter() - started, len(index.shards), target,
    )  # fmt: skip
    return TokenShards(index, report, built=True)


def token_shards(data: DataConfig, stream: StreamSettings) -> TokenShards:
    """The run's tokenised shards: reused when a build with this key is committed, else built
    now. Ray must be up."""
    key = cache_key(data, stream)
    directory = join(stream.token_cache_root, key_id(key))
    shards = committed_shards(directory)
    if shards is not None:
        log.info("token cache: reusing %d tokenised rows from %s", shards.rows, shards.directory)
        return shards
    return build_shards(data, stream, directory, key)
