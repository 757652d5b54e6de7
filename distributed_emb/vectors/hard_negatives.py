"""Label-free hard-negative mining over an embedding output: every row is an anchor, and its
negatives are the most similar other rows that are unlikely to be positives.

With no labels, the only positive a row has is its own second view (another dropout pass or
augmentation of the same text), whose similarity to the row is 1.0 for unit vectors: that is
the positive every margin below is measured against. For each anchor, in the vocabulary of
sentence-transformers' `mine_hard_negatives` (and its order of operations):

1. candidates: the anchor's `range_max` nearest other rows (the row itself is dropped), by
   the index (or an exact scan, `exact`), across every shard;
2. filters: drop candidates from the anchor's own `document` (document corpora), candidates
   whose text equals the anchor's, and candidates within the relative margin of the
   positive: keep only similarity < (1 − relative_margin) × 1.0, which removes the
   near-duplicates that are the likely false negatives;
3. window: skip the first `range_min` candidates that pass, and keep the next
   `num_negatives` ("top" sampling; NV-Retriever's TopK-PercPos with relative_margin 0.05).

One difference from sentence-transformers: a negative is kept only below the threshold
(`<`), where sentence-transformers also keeps one exactly on it; with margin 0 a copy of the
anchor (similarity 1.0) is then still refused.

The pass is Ray Data `map_batches` over the shard files, one task per shard: each task reads
its shard's rows as anchors, queries every shard's index in turn (read from OUT, one at a
time, merged as a running top-k: search.py), reads the candidates' ids, texts and documents
from their shards, and writes `negatives/part-<first_id>.parquet` (one row per negative: id,
text, negative, negative_id, negative_score) to the output directory. The driver receives only
each shard's counts and writes summary.json beside them, with the number of anchors that got
no negative.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from distributed_emb.checks import ConfigError
from distributed_emb.storage import exists, has_files, join, write_bytes, write_text
from distributed_emb.vectors.ann_index import read_index_info
from distributed_emb.vectors.mining_config import MiningConfig
from distributed_emb.vectors.search import lookup_columns, search_keys
from distributed_emb.vectors.shard_layout import (
    DOCUMENT,
    EMBEDDING,
    ID,
    TEXT,
    Manifest,
    ShardLayoutError,
    read_calibration,
    read_manifest,
    read_shard,
    shard_columns,
    unit_vectors,
)

log = logging.getLogger(__name__)

POSITIVE_SCORE = 1.0  # a unit vector's similarity to itself: the anchor's own second view
SUMMARY = "summary.json"
# The Parquet files in a folder of their own: pyarrow, Ray Data and `datasets` read a folder
# of Parquet whole, and summary.json or run.log beside them would break that.
NEGATIVES_DIR = "negatives"
OUTPUT_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("text", pa.string()),
        ("negative", pa.string()),
        ("negative_id", pa.int64()),
        ("negative_score", pa.float32()),
    ]
)


@dataclass
class ShardCounts:
    """What mining one shard's anchors gave: written to summary.json."""

    shard: str
    anchors: int = 0
    negatives: int = 0
    anchors_without_negative: int = 0
    anchors_with_fewer: int = 0  # some negatives, but fewer than num_negatives
    # Candidates inside range_max each filter removed (one candidate may count under several).
    removed_by_margin: int = 0
    removed_same_document: int = 0
    removed_same_text: int = 0


@dataclass
class Candidates:
    """Each anchor's nearest rows, best first: (n, m) arrays; ids −1 past the corpus's end."""

    ids: np.ndarray
    scores: np.ndarray
    texts: np.ndarray  # object
    documents: np.ndarray | None  # −1 where a row has none; None for sentence corpora


def choose_negatives(
    anchor_ids: np.ndarray,
    anchor_texts: np.ndarray,
    anchor_documents: np.ndarray | None,
    candidates: Candidates,
    config: MiningConfig,
    counts: ShardCounts | None = None,
) -> np.ndarray:
    """(n, m) bool: which candidates become negatives (steps 1–3 of the module docstring).
    Candidates must be sorted best first in each row. Adds what each filter removed to
    `counts`."""
    ids, scores = candidates.ids, candidates.scores
    others = (ids >= 0) & (ids != anchor_ids[:, None])  # a row is never its own negative
    window = others & (np.cumsum(others, axis=1) <= config.range_max)  # its range_max nearest
    margin_ok = scores < (1.0 - config.relative_margin) * POSITIVE_SCORE
    other_text = candidates.texts != anchor_texts[:, None]
    other_document = np.ones_like(window)
    if config.skip_same_document and anchor_documents is not None:
        if candidates.documents is not None:
            other_document = candidates.documents != anchor_documents[:, None]
    kept = window & margin_ok & other_text & other_document
    passed = np.cumsum(kept, axis=1)  # 1-based rank among those that pass
    chosen = (
        kept & (passed > config.range_min) & (passed <= config.range_min + config.num_negatives)
    )
    if counts is not None:
        counts.removed_by_margin += int((window & ~margin_ok).sum())
        counts.removed_same_text += int((window & ~other_text).sum())
        counts.removed_same_document += int((window & ~other_document).sum())
    return chosen


def find_candidates(manifest: Manifest, queries: np.ndarray, config: MiningConfig) -> Candidates:
    """The range_max + 1 nearest rows of each (unit) query, the query's own row among them,
    with their ids, texts and documents."""
    scores, keys = search_keys(
        manifest, queries, config.range_max + 1, exact=config.exact, ef_search=config.ef_search
    )
    found = lookup_columns(manifest, keys, [ID, TEXT, DOCUMENT])
    has_documents = bool((found[DOCUMENT] >= 0).any())
    return Candidates(
        ids=found[ID],
        scores=scores,
        texts=found[TEXT],
        documents=found[DOCUMENT] if has_documents else None,
    )


def mine_shard(
    manifest: Manifest, number: int, config: MiningConfig
) -> tuple[pa.Table, ShardCounts]:
    """The negatives of shard `number`'s anchors (OUTPUT_SCHEMA rows, anchor by anchor, most
    similar negative first) and its counts. In this process: the Ray pass runs it per task."""
    anchors = read_shard(manifest, number, (ID, EMBEDDING, TEXT, DOCUMENT))
    if anchors.text is None:
        raise ShardLayoutError(
            f"{manifest.shard_location(number)}: no text column: mining writes the anchors' "
            "and negatives' texts; embed with the text kept"
        )
    ranges = read_calibration(manifest) if manifest.dtype == "int8" else None
    queries = unit_vectors(anchors, manifest, ranges)  # (n, d)
    counts = ShardCounts(shard=anchors.entry.file, anchors=len(anchors.ids))
    if len(anchors.ids) == 0:
        return OUTPUT_SCHEMA.empty_table(), counts
    candidates = find_candidates(manifest, queries, config)
    chosen = choose_negatives(
        anchors.ids, anchors.text, anchors.document, candidates, config, counts
    )
    per_anchor = chosen.sum(axis=1)  # (n,)
    counts.negatives = int(per_anchor.sum())
    counts.anchors_without_negative = int((per_anchor == 0).sum())
    counts.anchors_with_fewer = int(((per_anchor > 0) & (per_anchor < config.num_negatives)).sum())
    anchor_row, position = np.nonzero(chosen)  # row-major: anchor by anchor, best first
    table = pa.table(
        {
            "id": pa.array(anchors.ids[anchor_row], pa.int64()),
            "text": pa.array(anchors.text[anchor_row].tolist(), pa.string()),
            "negative": pa.array(candidates.texts[anchor_row, position].tolist(), pa.string()),
            "negative_id": pa.array(candidates.ids[anchor_row, position], pa.int64()),
            "negative_score": pa.array(candidates.scores[anchor_row, position], pa.float32()),
        },
        schema=OUTPUT_SCHEMA,
    )
    return table, counts


def output_file(manifest: Manifest, number: int) -> str:
    """negatives/part-<first_id:012d>.parquet, named after the anchors' shard."""
    return f"{NEGATIVES_DIR}/part-{manifest.shards[number].first_id:012d}.parquet"


def mine_and_write(manifest: Manifest, number: int, config: MiningConfig) -> ShardCounts:
    """mine_shard, then its table written whole to output.dir (storage.write_bytes)."""
    import faiss

    # The task's CPUs, not every core of a node other tasks share.
    faiss.omp_set_num_threads(max(1, int(config.cpus_per_task)))
    table, counts = mine_shard(manifest, number, config)
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    write_bytes(join(config.output.dir, output_file(manifest, number)), buffer.getvalue())
    return counts


def check_inputs(config: MiningConfig) -> Manifest:
    """Before Ray starts: the manifest, a text column, the index (unless `exact`), and an
    output directory without earlier negatives (run.log may be there: the job's own log).
    Raises ShardLayoutError / ConfigError."""
    manifest = read_manifest(config.embeddings)
    if manifest.shards and TEXT not in shard_columns(manifest):
        raise ShardLayoutError(
            f"{manifest.shard_location(0)}: no text column: mining writes the anchors' and "
            "negatives' texts; embed with the text kept"
        )
    if manifest.dtype == "ubinary":
        raise ShardLayoutError(
            f"{manifest.path}: dtype ubinary: mining compares float vectors by inner product; "
            "embed with dtype float32 or int8"
        )
    if not config.exact:
        read_index_info(manifest)
    output = config.output.dir
    if has_files(join(output, NEGATIVES_DIR)) or exists(join(output, SUMMARY)):
        raise ConfigError(
            f"output.dir: {output} holds earlier negatives: choose another directory or "
            "delete them (part files of two runs would mix)"
        )
    return manifest


def _mine_batch(batch: dict[str, np.ndarray], manifest: Manifest, config: MiningConfig):
    """map_batches over shard numbers: each shard mined and written; its counts returned."""
    rows = [dataclasses.asdict(mine_and_write(manifest, int(n), config)) for n in batch["shard"]]
    return {name: np.array([row[name] for row in rows]) for name in rows[0]}


def mine_hard_negatives(config: MiningConfig) -> dict:
    """The Ray Data pass (one task per shard, `config.cpus_per_task` CPUs each; Ray must be
    up) and summary.json in output.dir; returns the summary."""
    import ray

    from distributed_emb.watchdog import no_silent_stall

    manifest = check_inputs(config)
    numbers = list(range(len(manifest.shards)))
    rows: list[dict] = []
    if numbers:
        shards = ray.data.from_items(
            [{"shard": n} for n in numbers], override_num_blocks=len(numbers)
        )
        mined = shards.map_batches(
            _mine_batch,
            fn_kwargs={"manifest": manifest, "config": config},
            batch_size=1,
            batch_format="numpy",
            num_cpus=config.cpus_per_task,
        )
        hint = "fix: cpus_per_task, or the cluster's nodes"
        with no_silent_stall(config.stall_timeout_s, hint=hint):
            rows = mined.take_all()
    per_shard = sorted(
        ({key: _plain(value) for key, value in row.items()} for row in rows),
        key=lambda row: row["shard"],
    )
    totals = {
        key: sum(row[key] for row in per_shard)
        for key in (f.name for f in dataclasses.fields(ShardCounts))
        if key != "shard"
    }
    summary = {
        "embeddings": str(config.embeddings),
        **totals,
        "settings": {
            name: getattr(config, name)
            for name in (
                "num_negatives",
                "range_min",
                "range_max",
                "relative_margin",
                "skip_same_document",
                "exact",
                "ef_search",
            )
        },
        "shards": per_shard,
    }
    write_text(join(config.output.dir, SUMMARY), json.dumps(summary, indent=2) + "\n")
    log.info(
        "mined %d negatives for %d anchors; %d anchors got none",
        summary["negatives"],
        summary["anchors"],
        summary["anchors_without_negative"],
    )
    return summary


def _plain(value):
    """A numpy scalar from Ray Data's batches as the Python value JSON writes."""
    return value.item() if hasattr(value, "item") else value
