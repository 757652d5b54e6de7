"""Mine hard negatives from embedding outputs: for labelled (anchor, positive) pairs, each
anchor's most similar corpus texts outside a margin of its positive's score; without labels,
each row's most similar other rows that are not near-duplicates of it, from other documents.

    python jobs/mine_negatives.py OUT --output DIR [--anchors A_OUT] [--num-negatives 3] \
        [--range-min 0] [--range-max 30] [--max-score S] [--min-score S] \
        [--relative-margin 0.05] [--absolute-margin M] [--sampling-strategy top|random] \
        [--seed 0] [--exact] [key=value ...]

OUT is what the embed job wrote (manifest.json, shards/ with a text column, and index/ from
its --index, unless --exact). Pairs: embed a pair table twice, its positive column into OUT
(data.text_column=positive --index) and its anchor column into A_OUT (data.text_column=anchor),
and pass --anchors A_OUT: every positive is a candidate of every anchor, the anchor's own
positives are dropped, and the margins are measured against anchor · positive. Unlabelled
(no --anchors): every row of OUT is an anchor, its positive its own second view (score 1.0),
and candidates from its own document (document corpora) are dropped. Then, as
sentence-transformers' mine_hard_negatives: candidates with the anchor's text, above max_score,
below min_score or within a margin of the positive's score are dropped, the first range_min
that remain are skipped, and num_negatives kept: the next ones (--sampling-strategy top) or,
seeded by --seed, drawn at random from those up to rank range_max (random). A Ray Data pass,
one task per anchors' shard, writes DIR/negatives/part-*.parquet, one row per negative: pairs
(id, anchor, positive, negative, negative_id, positive_score, negative_score), read by training
with data.kind=pairs data.negative_column=negative; unlabelled (id, text, negative,
negative_id, negative_score), read with data.negative_column=negative; and DIR/summary.json
(anchors, negatives, anchors without a negative, what each filter removed, the settings).
Every setting: --help; see vectors/hard_negatives.py.
"""

from __future__ import annotations

import sys

from distributed_emb.cli import Flag, Job, run_job
from distributed_emb.storage import is_remote
from distributed_emb.vectors.mining_config import MiningConfig


def check(config: MiningConfig) -> None:
    """Before Ray starts: the manifests (the anchors' with the same model and corpus), a text
    column, the index (unless --exact), and an output directory without earlier negatives."""
    from distributed_emb.vectors.hard_negatives import check_inputs

    check_inputs(config)


def run(config: MiningConfig) -> int:
    from distributed_emb.tracking import logs_on_storage
    from distributed_emb.vectors.hard_negatives import mine_hard_negatives

    with logs_on_storage(config.output.dir):  # an s3:// output keeps its run.log there
        summary = mine_hard_negatives(config)
    without_positive = (
        f", {summary['pairs_without_positive']} of them pairs without a positive in "
        f"{config.embeddings}"
        if config.anchors is not None
        else ""
    )
    print(
        f"{summary['negatives']} negatives for {summary['anchors']} anchors "
        f"({summary['anchors_without_negative']} anchors got none{without_positive}, "
        f"{summary['anchors_with_fewer']} fewer than {config.num_negatives}); removed inside "
        f"the window: {summary['removed_by_margin']} by the margins, "
        f"{summary['removed_above_max_score']} above max_score, "
        f"{summary['removed_below_min_score']} below min_score, "
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
        Flag("--anchors", "pairs: the output of the pair table's anchor column", key="anchors"),
        Flag("--num-negatives", "negatives per anchor", key="num_negatives", type=int),
        Flag("--range-min", "passing candidates skipped first", key="range_min", type=int),
        Flag("--range-max", "nearest other rows taken as candidates", key="range_max", type=int),
        Flag("--max-score", "skip candidates scoring above this", key="max_score", type=float),
        Flag("--min-score", "skip candidates scoring below this", key="min_score", type=float),
        Flag(
            "--relative-margin",
            "keep similarity <= positive - |positive| * margin",
            key="relative_margin",
            type=float,
        ),
        Flag(
            "--absolute-margin",
            "keep similarity + margin <= positive",
            key="absolute_margin",
            type=float,
        ),
        Flag(
            "--sampling-strategy",
            "top: the most similar that pass; random: drawn from them",
            key="sampling_strategy",
        ),
        Flag("--seed", "the seed of random sampling", key="seed", type=int),
        Flag("--exact", "exact neighbours (a scan) instead of the index", key="exact", const=True),
    ),
)


if __name__ == "__main__":
    sys.exit(run_job(JOB))
