"""The `data` section of a training config: what the corpus is, how it is read, cleaned,
tokenised, shuffled and cut. Declared here, beside the code that reads it; the training config
(config.py) composes it with the other sections. What the data path needs from outside this
section comes as `StreamSettings` (data/stream_settings.py), never as the whole config."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from distributed_emb.checks import require
from distributed_emb.settings import Seed, section


@section
class DataConfig:
    path: Annotated[
        str | None,
        Field(
            description="the training corpus: a file (.txt .jsonl/.json .parquet .arrow, "
            "optionally .gz/.zst/.bz2), directory, glob, s3:// or gs:// URI, saved Hugging Face "
            "dataset or hub name (org/name); null: the shipped Wikipedia sentences"
        ),
    ] = None
    text_column: Annotated[
        str, Field(description="the text field of JSONL / Parquet / HF rows")
    ] = "text"
    hf_split: Annotated[str, Field(description="the split of a Hugging Face dataset")] = "train"
    kind: Annotated[
        Literal["sentences", "pairs"],
        Field(
            description="sentences: one text per row, two dropout views (InforMin-CL, SimCSE); "
            "pairs: anchor/positive columns (InfoCSE)"
        ),
    ] = "sentences"
    anchor_column: Annotated[str, Field(description="pairs: the anchor field")] = "anchor"
    positive_column: Annotated[str, Field(description="pairs: the positive field")] = "positive"
    # A third text a row: what jobs/mine_negatives.py writes (its column `negative`). Read,
    # cleaned and tokenised as the row's other texts are (data/corpus.py corpus_columns).
    negative_column: Annotated[
        str | None,
        Field(
            description="a hard negative a row (sentences and pairs; jobs/mine_negatives.py "
            "writes it as `negative`): embedded with the views, and a candidate of every "
            "anchor of the global batch in the contrastive term (not masked by "
            "data.group_column: its group is not known); a row whose negative is missing, "
            "null or empty is dropped and counted, as one without its text; null: none"
        ),
    ] = None
    group_column: Annotated[
        str | None,
        Field(
            description="a group (document) id: rows of one group are never each other's "
            "negatives, and are one cluster of the MCR² term (loss.mcr2_weight)"
        ),
    ] = None
    # An all-to-all pass over the whole corpus before the first step (docs/BENCHMARKS.md),
    # so off by default.
    deduplicate: Annotated[
        bool, Field(description="exact, distributed de-duplication of identical rows")
    ] = False
    dedup_partitions: Annotated[
        int, Field(ge=1, description="hash partitions of the de-duplication shuffle")
    ] = 16
    max_rows: Annotated[
        int | None, Field(ge=1, description="take only the first N clean rows (quick runs)")
    ] = None
    # No real sentence is this long; a broken file's megabyte "line" is.
    max_chars: Annotated[
        int,
        Field(
            ge=1,
            description="rows longer than this many characters are dropped and counted "
            "(too_long) before tokenisation",
        ),
    ] = 20_000
    block_rows: Annotated[
        int,
        Field(
            ge=1,
            description="rows per block read: the unit of the build's parallelism and counting",
        ),
    ] = 10_000
    # data/shuffle.py: the same order for any worker count.
    shuffle_seed: Annotated[
        Seed | None,
        Field(
            description="seed of the corpus order, drawn per epoch (spans of the whole corpus "
            "permuted, rows shuffled within windows); null: corpus order"
        ),
    ] = 0
    tokenize_batch_rows: Annotated[
        int, Field(ge=1, description="rows per tokenising task call")
    ] = 1024
    token_cache_dir: Annotated[
        str | None,
        Field(
            description="where the corpus's indexed token shards live, built once and reused "
            "by every run with the same corpus and tokenizer (local or s3://); null: "
            "<storage path>/token_cache"
        ),
    ] = None
    # Less padding (data/epoch_plan.py, docs/BENCHMARKS.md).
    length_group_batches: Annotated[
        int,
        Field(
            ge=0,
            description="> 1: sort each pool of this many global batches by length before "
            "cutting it; 0 or 1: batches as they come",
        ),
    ] = 0


def validate_negative_column(data: DataConfig, contrastive_weight: float) -> None:
    """`data.negative_column`, where set: a column of its own (not one of the row's texts or its
    group), read by a term that uses it (only the contrastive term has candidates)."""
    column = data.negative_column
    if column is None:
        return
    if data.kind == "sentences":
        taken = {"data.text_column": data.text_column}
    else:
        taken = {
            "data.anchor_column": data.anchor_column,
            "data.positive_column": data.positive_column,
        }
    if data.group_column is not None:
        taken["data.group_column"] = data.group_column
    for key, other in taken.items():
        require(
            column != other,
            "data.negative_column",
            f"{column!r} is also {key}: name the column holding each row's hard negative",
        )
    require(
        contrastive_weight > 0,
        "data.negative_column",
        "hard negatives are candidates of the contrastive term, and loss.contrastive_weight is "
        "0: give it a weight or set data.negative_column=null",
    )
