"""Embed a whole corpus into Parquet shards, with Ray Data, resumable block by block.

    corpus files ──► read tasks (one per file: data/readers.py, cleaned and counted by
        │            data/corpus.py KeepCleanRows) ──► one row per corpus block:
        │            {block (its first line's id), rows, ids[], texts[], embed}
        ▼
    encoding actors (model/embedder.py encoding_pool, laid out by vectors/embed_layout.py; each
        │            loads the model, or its ONNX graph with embed.backend=onnx|onnx_int8, once):
        │            ShardEmbedder (GraphShardEmbedder) embeds a block's texts, sorted by length
        │            for the batches and written back in row order, quantises them and writes
        │            the block as OUT/shards/part-<block>.parquet, whole or not at all
        ▼
    the driver: one small summary row per block (rows, written or skipped) ──► manifest.json

Why a block travels as one row: Ray Data merges and splits its own blocks as it likes (a read
task's output is cut to the target block size and spread for parallelism), so a corpus block
sent as many rows could reach the writer in pieces. As one row it cannot be split: one actor
call embeds and writes exactly one corpus block, whatever the cluster does, and a block is the
unit that is redone when its actor dies (`embed.max_restarts`) and skipped when its shard is
already there. Block bounds are the reader's (`embed.block_rows` lines of one file), so the same
corpus gives the same blocks, ids and shard names in every run, whatever the actor count.

Prompts: corpus rows are documents, embedded as sentence-transformers' ``encode_document``
embeds them: the model's own document prompt, or `prompts.document` (model/embedder.py
Embedder, `embed_as="document"`); the int8 calibration sample too. `embed.rows_as=query`
embeds them as ``encode_query`` does instead (`prompts.query`): the anchors of a pair table,
which mining searches the documents with. The manifest records the prompts settings (search
embeds its queries with `prompts.query`), `rows_as` and the text put before each row
(`row_prompt`).

Resuming: a present shard is a finished block (shards are written under a temporary name and
renamed). A rerun into the same OUT reads and cleans the corpus again (exact drop counts, and
each finished shard's row count is checked against its block) but embeds only the blocks
without a shard. OUT/embedding_settings.json, written before the first shard, holds everything
that decides a shard's content (model and its files, pooling, document prompt, length, precision,
backend, block size, corpus files and reading rules); a run whose settings differ is refused,
naming the key.

Layout and backend: the actors' count, threads and reservations are what embed.* sets, the
rest decided from the cluster (vectors/embed_layout.py: on one CPU node one actor with every
core); with an ONNX backend the driver first finds or exports the graph and refuses one whose
agreement with torch fails the export's check (vectors/embed_backend.py). The manifest records
the backend and that agreement.

The driver holds block ids and counters, never rows or vectors: the int8 calibration's
per-dimension min and max are folded batch by batch, and `data.max_rows` is turned into "the
last block and its rows" from a stream of per-block counts.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from distributed_emb.data.corpus import (
    STREAM_BLOCK_BYTES,
    CorpusError,
    KeepCleanRows,
    collect_report,
    corpus_path,
    start_drop_counter,
    text_rules,
)
from distributed_emb.data.corpus_dataset import training_dataset
from distributed_emb.data.readers import ROW_ID, DropReport, TextRows, read_file_blocks, row_id
from distributed_emb.data.sources import CorpusFiles, resolve_sources
from distributed_emb.model.embedder import EMBEDDING_COLUMN, Embedder, encoding_pool
from distributed_emb.progress_report import Progress
from distributed_emb.storage import is_remote, join
from distributed_emb.vectors.embed_backend import (
    GRAPHS,
    Graph,
    GraphEmbedder,
    graph_reference,
    prepare_graph,
)
from distributed_emb.vectors.embed_config import EmbedJobConfig
from distributed_emb.vectors.embed_layout import EmbedLayout, cluster_layout
from distributed_emb.vectors.embedding_settings import embedding_settings, require_same_settings
from distributed_emb.vectors.shard_layout import CALIBRATION, EMBEDDING, FORMAT, ID, MANIFEST, TEXT
from distributed_emb.vectors.shard_writer import (
    SETTINGS,
    SHARDS,
    finished_shards,
    load_calibration,
    read_json,
    remove_unfinished_writes,
    save_calibration,
    shard_location,
    shard_name,
    shard_rows,
    write_json,
    write_shard,
)
from distributed_emb.watchdog import no_silent_stall

log = logging.getLogger(__name__)

# The columns of a block row (one corpus block) and of an actor's summary row.
BLOCK = "block"  # the id of the block's first line: its shard's name
ROWS = "rows"  # kept rows of the block (after data.max_rows)
IDS = "ids"
TEXTS = "texts"
EMBED = "embed"  # false: its shard is there already (ids and texts are left empty)
WRITTEN = "written"
DIM = "dim"
NORMALIZED = "normalized"
PROMPT = "prompt"  # the text put before each row ("" for none)
# What the torch model multiplied in (model/compute_dtype.py; null for a graph) and, for
# bfloat16, its check against float32 (JSON).
COMPUTED_IN = "computed_in"
PRECISION_CHECK = "precision_check"


@dataclass(frozen=True)
class Cut:
    """Where `data.max_rows` ends the corpus: the last block embedded and its rows kept."""

    block: int
    rows: int


@dataclass
class EmbedResult:
    out: str
    rows: int  # rows in the output (every shard)
    rows_embedded: int  # rows embedded by this run
    shards_written: int
    shards_skipped: int
    report: DropReport  # what reading kept and dropped, by reason
    manifest: dict = field(default_factory=dict)
    seconds: float = 0.0
    layout: EmbedLayout | None = None


# ---------------------------------------------------------------------------------------------
# Reading: one row per corpus block, in the read task that parsed it
# ---------------------------------------------------------------------------------------------


def read_blocks(
    batch: dict,
    files: CorpusFiles,
    rules: TextRows,
    block_rows: int,
    counter=None,
    finished: frozenset[int] = frozenset(),
    out: str | None = None,
    cut: Cut | None = None,
    counts_only: bool = False,
) -> Iterator[pa.Table]:
    """The corpus blocks of the files in `batch["file"]`, each as a one-row table: cleaned and
    counted (KeepCleanRows, `counter`), cut where `cut` says, and marked finished where its
    shard is in `finished` with the block's row count. `counts_only`: {block, rows} alone."""
    keep = KeepCleanRows(counter)
    text_column = rules.fields[0]
    for index in (int(i) for i in batch["file"]):
        file, filesystem = files.files[index], files.filesystems[index]
        if cut is not None and row_id(index, 1) > cut.block:
            continue  # the whole file lies past data.max_rows: not opened
        for parsed in read_file_blocks(filesystem, file, rules, block_rows):
            first_id = parsed.column(ROW_ID)[0].as_py()  # its first line's, kept or not
            if cut is not None and first_id > cut.block:
                break
            kept = keep(parsed)  # (kept rows, columns: text, _row_id)
            if cut is not None and first_id == cut.block:
                kept = kept.slice(0, cut.rows)
            if counts_only:
                yield pa.table({BLOCK: [first_id], ROWS: [kept.num_rows]})
                continue
            done = first_id in finished and _finished(out, first_id, kept.num_rows)
            embed = kept.num_rows > 0 and not done
            carried = kept if embed else kept.slice(0, 0)
            yield pa.table(
                {
                    BLOCK: pa.array([first_id], pa.int64()),
                    ROWS: pa.array([kept.num_rows], pa.int64()),
                    IDS: _as_one_list(carried.column(ROW_ID)),
                    TEXTS: _as_one_list(carried.column(text_column)),
                    EMBED: pa.array([embed]),
                }
            )


def _as_one_list(column: pa.ChunkedArray) -> pa.Array:
    """A column's values as the single list of a one-row list column (no copy to Python)."""
    values = column.combine_chunks()
    return pa.ListArray.from_arrays(pa.array([0, len(values)], pa.int32()), values)


def _finished(out: str, first_id: int, rows: int) -> bool:
    """Is the block's shard there, holding the block's rows? A shard with other rows (written
    by hand, or by another version) is embedded again."""
    location = shard_location(out, first_id)
    found = shard_rows(location)
    if found != rows:
        log.warning("%s holds %s rows, its block %d: embedding it again", location, found, rows)
    return found == rows


def block_dataset(files: CorpusFiles, read_options: dict, ordered: bool = False):
    """A lazy Ray Dataset of the corpus's block rows: one read task per file (read_blocks
    with `read_options`); `ordered`: in corpus order."""
    import ray  # startup

    tasks = ray.data.from_items(
        [{"file": index} for index in range(len(files.files))],
        override_num_blocks=max(1, len(files.files)),
    )
    blocks = tasks.map_batches(
        read_blocks, batch_size=1, fn_kwargs={"files": files, **read_options}
    )
    context = blocks.context
    # A read task's block rows move on a few MiB at a time, not after 128 MiB of them.
    context.target_max_block_size = STREAM_BLOCK_BYTES
    context.execution_options.preserve_order = ordered
    return blocks


def rows_cut(files: CorpusFiles, rules: TextRows, block_rows: int, max_rows: int) -> Cut | None:
    """data.max_rows as a cut: the blocks' clean row counts, read in corpus order until they
    reach `max_rows` (the reading stops there); None when the corpus has fewer clean rows."""
    counts = block_dataset(
        files, {"rules": rules, "block_rows": block_rows, "counts_only": True}, ordered=True
    )
    total = 0
    for row in counts.iter_rows():
        total += row[ROWS]
        if total >= max_rows:
            return Cut(block=row[BLOCK], rows=row[ROWS] - (total - max_rows))
    return None


# ---------------------------------------------------------------------------------------------
# The encoding actor: a block row in, its shard written, a summary row out
# ---------------------------------------------------------------------------------------------


class BlockWriter:
    """What an encoding actor does with block rows, over any embedder (its `embed`, `prompt`,
    `dimension`, `normalizes` and `embed_as`): embeds each block's texts, writes its shard and
    returns one summary row per block: {block, rows, written, dim, normalized, prompt}. The
    rows are embedded as `embed_as` (documents, or queries: embed.rows_as), which the pool
    sets. A block's texts go to `embed` whole: the torch model (SentenceTransformer.encode) and
    the graph (OnnxEmbedder.embed) both sort them by length before cutting batches, so each
    batch pads little, and return the vectors in row order."""

    def _setup_writing(
        self, out: str, precision: str, ranges: np.ndarray | None, write_text: bool
    ) -> None:
        self.out = out
        self.precision = precision
        self.ranges = None if ranges is None else np.asarray(ranges, dtype=np.float32)
        self.write_text = write_text

    def __call__(self, batch: pa.Table) -> pa.Table:
        blocks = batch.column(BLOCK).to_pylist()
        written = batch.column(EMBED).to_pylist()
        for index, embed in enumerate(written):
            if embed:
                ids = batch.column(IDS)[index].values.to_numpy()  # (n,)
                texts = batch.column(TEXTS)[index].values.to_pylist()
                self.write_block(blocks[index], ids, texts)
        count = batch.num_rows
        return pa.table(
            {
                BLOCK: pa.array(blocks, pa.int64()),
                ROWS: batch.column(ROWS),
                WRITTEN: pa.array(written, pa.bool_()),
                DIM: pa.array([self.dimension] * count, pa.int64()),
                NORMALIZED: pa.array([self.normalizes] * count, pa.bool_()),
                PROMPT: pa.array([self.prompt(self.embed_as)] * count, pa.string()),
                COMPUTED_IN: pa.array([self.compute_dtype] * count, pa.string()),
                PRECISION_CHECK: pa.array([self._check_json()] * count, pa.string()),
            }
        )

    def _check_json(self) -> str | None:
        check = self.precision_check
        return None if check is None else json.dumps(check.as_dict())

    def write_block(self, first_id: int, ids: np.ndarray, texts: list[str]) -> None:
        # Embedded as `embed_as` (embed.rows_as): (n, d) float32 | int8, or (n, d/8) uint8.
        vectors = self.stored(self.embed(texts, role=self.embed_as))
        columns = {
            ID: pa.array(ids, pa.int64()),
            EMBEDDING: pa.FixedSizeListArray.from_arrays(
                pa.array(vectors.reshape(-1)), vectors.shape[1]
            ),
        }
        if self.write_text:
            columns[TEXT] = pa.array(texts, pa.string())
        write_shard(pa.table(columns), shard_location(self.out, first_id))

    def stored(self, vectors: np.ndarray) -> np.ndarray:
        """The vectors as the shard stores them (embed.precision)."""
        if self.precision == "float32":
            return vectors
        from sentence_transformers import quantize_embeddings  # startup

        return quantize_embeddings(vectors, precision=self.precision, ranges=self.ranges)


class ShardEmbedder(BlockWriter, Embedder):
    """The torch model (an :class:`~distributed_emb.model.embedder.Embedder`, loaded once per
    actor) writing block rows as shards (:class:`BlockWriter`)."""

    def __init__(
        self,
        out: str,
        precision: str,
        ranges: np.ndarray | None,
        write_text: bool,
        **embedder,
    ) -> None:
        Embedder.__init__(self, **embedder)
        self._setup_writing(out, precision, ranges, write_text)


class GraphShardEmbedder(BlockWriter, GraphEmbedder):
    """The exported graph (vectors/embed_backend.py :class:`GraphEmbedder`, onnxruntime, no
    torch model) writing block rows as shards (:class:`BlockWriter`)."""

    def __init__(
        self,
        out: str,
        precision: str,
        ranges: np.ndarray | None,
        write_text: bool,
        **embedder,
    ) -> None:
        GraphEmbedder.__init__(self, **embedder)
        self._setup_writing(out, precision, ranges, write_text)


# ---------------------------------------------------------------------------------------------
# The pass
# ---------------------------------------------------------------------------------------------


def _pool_options(
    config: EmbedJobConfig, location: str, pooler: str | None, layout: EmbedLayout | None = None
) -> dict:
    """encoding_pool's keywords but the embedder class: the model at `location` (or the
    graph's folder), how it embeds, and `layout`'s actors, threads and reservations (None:
    the embed.* settings as given)."""
    embed = config.embed
    shape = {
        "concurrency": embed.concurrency,
        "num_cpus_per_actor": embed.num_cpus_per_actor,
        "num_gpus_per_actor": embed.num_gpus_per_actor,
        "torch_threads": embed.torch_threads,
    }
    if layout is not None:
        shape = {
            "concurrency": layout.concurrency,
            "num_cpus_per_actor": layout.num_cpus_per_actor,
            "num_gpus_per_actor": layout.num_gpus_per_actor,
            "torch_threads": layout.threads,
        }
    return {
        "model_path": location,
        "pooler": pooler,
        "batch_size": embed.batch_size,
        "max_seq_length": embed.max_seq_length,
        **shape,
        "normalize": embed.normalize,
        "trust_remote_code": config.model.trust_remote_code,
        "max_restarts": embed.max_restarts,
        # Rows are documents (or queries: embed.rows_as), the calibration sample too.
        "embed_as": embed.rows_as,
        "query_prompt": config.prompts.query,
        "document_prompt": config.prompts.document,
    }


def _graph_options(graph: Graph | None) -> dict:
    """GraphEmbedder's keywords beyond Embedder's (the variant); none for torch."""
    return {} if graph is None else {"variant": graph.variant}


def graph_cache(config: EmbedJobConfig) -> str:
    """embed.graph_cache, or OUT/graphs; a local path made absolute (actors read it)."""
    location = config.embed.graph_cache or join(config.embed.output_dir, GRAPHS)
    return location if is_remote(location) else str(Path(location).resolve())


def calibration_ranges(
    config: EmbedJobConfig, pool: dict, graph: Graph | None = None
) -> np.ndarray:
    """int8's (2, d) per-dimension [min, max]: OUT/calibration.npy when an earlier run saved
    it (every shard must be quantised alike), else the min and max over the embeddings of the
    corpus's first `embed.calibration_rows` clean rows, folded batch by batch, then saved."""
    out = config.embed.output_dir
    saved = load_calibration(out)
    if saved is not None:
        log.info("int8 ranges: %s", join(out, CALIBRATION))
        return saved
    sample = training_dataset(config.data, None).limit(config.embed.calibration_rows)
    text = config.data.text_column
    embedded = encoding_pool(
        sample.select_columns([text]),
        text_column=text,
        embedder_class=Embedder if graph is None else GraphEmbedder,
        embedder_kwargs=_graph_options(graph),
        **pool,
    )
    low = high = None
    hint = "fix: embed.concurrency, embed.num_cpus_per_actor or the cluster's nodes"
    with no_silent_stall(config.embed.stall_timeout_s, hint=hint):
        for batch in embedded.iter_batches(batch_size=None, batch_format="numpy"):
            vectors = np.asarray(batch[EMBEDDING_COLUMN], dtype=np.float32)  # (B, d)
            if len(vectors) == 0:
                continue
            low = vectors.min(0) if low is None else np.minimum(low, vectors.min(0))
            high = vectors.max(0) if high is None else np.maximum(high, vectors.max(0))
    if low is None:
        raise CorpusError(f"{corpus_path(config.data)}: no usable rows to calibrate int8 on")
    ranges = np.stack([low, high])  # (2, d)
    save_calibration(out, ranges)
    log.info("int8 ranges from the first %d clean rows", config.embed.calibration_rows)
    return ranges


def embed_corpus(config: EmbedJobConfig, layout: EmbedLayout | None = None) -> EmbedResult:
    """Embed the corpus of `config.data` into `config.embed.output_dir` (see the module doc);
    Ray must be up. `layout`: the pool's shape (None: decided here from the cluster and
    logged). Returns what was embedded, skipped and dropped; the manifest is written last."""
    started = time.perf_counter()
    embed, data = config.embed, config.data
    out = embed.output_dir
    specs = corpus_path(data)
    files = resolve_sources(specs, data.hf_split)
    settings = embedding_settings(config, files)
    require_same_settings(out, settings)
    if read_json(join(out, SETTINGS)) is None:
        write_json(join(out, SETTINGS), settings)
    if layout is None:
        layout = cluster_layout(embed)
        log.info("%s", layout.line)
    graph = None
    if embed.backend != "torch":
        graph = prepare_graph(
            embed.backend,
            settings["model"],
            settings["model_files"],
            settings["pooler"],
            graph_cache(config),
            embed.max_seq_length,
            config.model.trust_remote_code,
        )
    location = settings["model"] if graph is None else graph.location
    pool = _pool_options(config, location, settings["pooler"], layout)
    rules = text_rules(data)
    ranges = calibration_ranges(config, pool, graph) if embed.precision == "int8" else None
    cut = None
    if data.max_rows is not None:
        cut = rows_cut(files, rules, embed.block_rows, data.max_rows)
    finished = frozenset(finished_shards(out))

    import ray  # startup

    counter = start_drop_counter()
    summaries: dict[int, dict] = {}
    try:
        read_options = {
            "rules": rules, "block_rows": embed.block_rows, "counter": counter,
            "finished": finished, "out": out, "cut": cut,
        }  # fmt: skip
        # Each block row a Ray block of its own: the actors take corpus blocks one by one,
        # spread over the pool, not a read task's whole output each.
        blocks = block_dataset(files, read_options).repartition(target_num_rows_per_block=1)
        shards = encoding_pool(
            blocks,
            **pool,
            rows_per_call=1,
            batch_format="pyarrow",
            embedder_class=ShardEmbedder if graph is None else GraphShardEmbedder,
            embedder_kwargs={
                "out": out,
                "precision": embed.precision,
                "ranges": ranges,
                "write_text": embed.write_text,
                # The torch model's number format (the int8 calibration sample is float32's).
                "compute_dtype": embed.compute_dtype,
                **_graph_options(graph),
            },
        )
        hint = "fix: embed.concurrency, embed.num_cpus_per_actor or the cluster's nodes"
        # The total is known when data.max_rows cut the corpus; otherwise the count and rate.
        total = None if cut is None else config.data.max_rows
        with (
            no_silent_stall(embed.stall_timeout_s, hint=hint),
            Progress("embed", total, "rows") as progress,
        ):
            for batch in shards.iter_batches(batch_size=None, batch_format="pyarrow"):
                for row in batch.to_pylist():
                    if row[BLOCK] not in summaries:  # a retried block reports the same row
                        progress.update(row[ROWS])
                    summaries[row[BLOCK]] = row
        report = collect_report(counter)
    finally:
        ray.kill(counter)
    remove_unfinished_writes(out)
    manifest = _manifest(config, settings, specs, summaries, report, cut, graph)
    write_json(join(out, MANIFEST), manifest)
    written = [s for s in summaries.values() if s[WRITTEN]]
    return EmbedResult(
        out=out,
        rows=manifest["rows"],
        rows_embedded=sum(s[ROWS] for s in written),
        shards_written=len(written),
        shards_skipped=len(manifest["shards"]) - len(written),
        report=report,
        manifest=manifest,
        seconds=time.perf_counter() - started,
        layout=layout,
    )


def _manifest(
    config: EmbedJobConfig,
    settings: dict,
    specs: str | list[str],
    summaries: dict[int, dict],
    report: DropReport,
    cut: Cut | None,
    graph: Graph | None = None,
) -> dict:
    """manifest.json, after checking that every clean row is in exactly one shard: the shards'
    rows add up to the rows reading kept (or to data.max_rows)."""
    shards = [summaries[key] for key in sorted(summaries) if summaries[key][ROWS] > 0]
    rows = sum(s[ROWS] for s in shards)
    if not shards:
        raise CorpusError(f"{specs}: no usable rows ({report.summary()})")
    expected = report.kept if cut is None else config.data.max_rows
    if rows != expected:
        raise RuntimeError(f"the shards hold {rows} rows, reading kept {expected}")
    return {
        "format": FORMAT,
        "model": settings["model"],
        "dim": int(shards[0][DIM]),
        "normalized": bool(shards[0][NORMALIZED]),
        "dtype": config.embed.precision,
        "rows": rows,
        "shards": [
            {"file": f"{SHARDS}/{shard_name(s[BLOCK])}", "first_id": s[BLOCK], "rows": s[ROWS]}
            for s in shards
        ],
        "dropped": dict(sorted(report.dropped.items())),
        "corpus": [specs] if isinstance(specs, str) else list(specs),
        "read": report.rows,
        "kept": report.kept,
        "block_rows": config.embed.block_rows,
        "max_seq_length": config.embed.max_seq_length,
        # Queries must be embedded as the corpus was (jobs/search.py reads both).
        "pooler": settings["pooler"],  # None: the model's own pooling, as saved
        # The settings (null: the model's own prompt); search reads "query".
        "prompts": {"query": config.prompts.query, "document": config.prompts.document},
        "rows_as": config.embed.rows_as,  # each row embedded as a document or as a query
        "row_prompt": shards[0][PROMPT],  # the text put before each row ("" for none)
        "text": config.embed.write_text,
        "calibration": CALIBRATION if config.embed.precision == "int8" else None,
        # What embedded the rows (search embeds its queries the same way), and for a graph
        # its agreement with the torch model (the export's check, vectors/embed_backend.py).
        "backend": config.embed.backend,
        "graph": None if graph is None else graph_reference(config.embed.output_dir, graph),
        "agreement": None if graph is None else graph.agreement,
        # The torch model's number format (embed.compute_dtype; model/compute_dtype.py): what
        # the blocks this run wrote were multiplied in, and bfloat16's check against float32
        # (the worst actor's figures). None for a graph.
        **_precision(summaries),
    }


def _precision(summaries: dict[int, dict]) -> dict:
    """The manifest's compute_dtype (the dtypes the written blocks were embedded in, sorted)
    and precision_check (the lowest mean cosine any actor's check found, with its figures)."""
    written = [s for s in summaries.values() if s[WRITTEN]]  # a graph's summaries say None
    dtypes = sorted({s[COMPUTED_IN] for s in written if s[COMPUTED_IN]})
    checks = [json.loads(s[PRECISION_CHECK]) for s in written if s[PRECISION_CHECK]]
    worst = min(checks, key=lambda check: check["mean_cosine"], default=None)
    return {"compute_dtype": dtypes or None, "precision_check": worst}
