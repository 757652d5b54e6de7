"""Mine hard negatives from an embedding output, without labels: each row's most similar other
rows that are not near-duplicates of it, from other documents.

    python jobs/mine_negatives.py OUT --output DIR [--num-negatives 3] [--range-min 0] \
        [--range-max 30] [--relative-margin 0.05] [--exact] [key=value ...]

OUT is what the embed job wrote (manifest.json, shards/ with a text column, and index/ from
its --index, unless --exact). Every row is an anchor: its range_max nearest other rows are the
candidates; those from its own document (document corpora), with its exact text, or with a
similarity ≥ (1 − relative_margin) (its own second view scores 1.0) are dropped; the first
range_min that remain are skipped and the next num_negatives kept (sentence-transformers'
mine_hard_negatives settings, "top" sampling). A Ray Data pass, one task per shard, writes
DIR/negatives/part-*.parquet (id, text, negative, negative_id, negative_score: one row per
negative) and DIR/summary.json (anchors, negatives, anchors without a negative, what each
filter removed). Every setting: --help; see vectors/hard_negatives.py.
"""

from __future__ import annotations

import sys

from distributed_emb.cli import Flag, Job, run_job
from distributed_emb.storage import is_remote
from distributed_emb.vectors.mining_config import MiningConfig


def check(config: MiningConfig) -> None:
    """Before Ray starts: the manifest, a text column, the index (unless --exact), and an
    output directory without earlier negatives."""
    from distributed_emb.vectors.hard_negatives import check_inputs

    check_inputs(config)


def run(config: MiningConfig) -> int:
    from distributed_emb.vectors.hard_negatives import mine_hard_negatives

    summary = mine_hard_negatives(config)
    print(
        f"{summary['negatives']} negatives for {summary['anchors']} anchors "
        f"({summary['anchors_without_negative']} anchors got none, "
        f"{summary['anchors_with_fewer']} fewer than {config.num_negatives}); removed inside "
        f"the window: {summary['removed_by_margin']} by the margin, "
        f"{summary['removed_same_document']} from the anchor's document, "
        f"{summary['removed_same_text']} with its text"
    )
    where = config.output.dir
    print(f"negatives: {where}/negatives/part-*.parquet; counts: {where}/summary.json")
    return 0


JOB = Job(
    description=__doc__.split("\n\n")[0],
    config_class=MiningConfig,
    default_config=None,
    check=check,
    run=run,
    # run.log beside the negatives, where they are on a local disk.
    log_dir=lambda config: None if is_remote(config.output.dir) else config.output.dir,
    flags=(
        Flag("embeddings", "the embedding output directory OUT", key="embeddings"),
        Flag("--num-negatives", "negatives per anchor", key="num_negatives", type=int),
        Flag("--range-min", "passing candidates skipped first", key="range_min", type=int),
        Flag("--range-max", "nearest other rows taken as candidates", key="range_max", type=int),
        Flag(
            "--relative-margin", "keep similarity < (1 - margin)", key="relative_margin", type=float
        ),
        Flag("--exact", "exact neighbours (a scan) instead of the index", key="exact", const=True),
    ),
)


if __name__ == "__main__":
    sys.exit(run_job(JOB))
