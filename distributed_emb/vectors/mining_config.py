"""The settings of hard-negative mining (jobs/mine_negatives.py), declared once.

The window, filters and sampling keep sentence-transformers' `mine_hard_negatives` names and
meaning (range_min, range_max, max_score, min_score, relative_margin, absolute_margin,
num_negatives, sampling_strategy "top" or "random"); what they do to a labelled pair table
(`anchors` set) and to an unlabelled corpus: vectors/hard_negatives.py.
"""

from __future__ import annotations

from dataclasses import field
from typing import Annotated, Literal

from pydantic import Field

from distributed_emb.checks import ConfigError
from distributed_emb.ray_config import RayConfig, validate_ray_config
from distributed_emb.settings import section
from distributed_emb.watchdog import DEFAULT_STALL_TIMEOUT_S


@section
class MiningOutputConfig:
    dir: Annotated[
        str,
        Field(
            description="where the negatives go (negatives/part-*.parquet, one per anchors' "
            "shard, summary.json and run.log): a local path or a URI; must be empty or new"
        ),
    ] = "outputs/negatives"


@section
class MiningConfig:
    embeddings: Annotated[
        str | None,
        Field(
            description="the embedding output directory OUT (manifest.json, shards/, index/) "
            "whose rows are the candidates; unlabelled (anchors null): each row is also an "
            "anchor; pairs: the pair table's positive column (embed data.text_column=positive)"
        ),
    ] = None
    # Pairs: the table's two columns embedded as two outputs by the embed job; a row's anchor
    # and positive share its id, which is how the anchor's positive is found.
    anchors: Annotated[
        str | None,
        Field(
            description="pairs: the embedding output of the same pair table's anchor column "
            "(embed data.text_column=anchor, same model): each row is an anchor, its positive "
            "the row of `embeddings` with its id; null: unlabelled, every row of `embeddings` "
            "is an anchor"
        ),
    ] = None
    output: MiningOutputConfig = field(default_factory=MiningOutputConfig)
    num_negatives: Annotated[
        int, Field(ge=1, description="negatives kept per anchor (the most similar that pass)")
    ] = 3
    range_min: Annotated[
        int,
        Field(
            ge=0,
            description="skip this many of the candidates that pass the filters, most similar "
            "first (sentence-transformers' range_min)",
        ),
    ] = 0
    # sentence-transformers derives range_max = range_min + 10 · num_negatives (+ p) when a
    # margin or max_score is set: room for candidates the filters remove. 30 is that for the
    # default num_negatives, without p; null derives it as sentence-transformers does.
    range_max: Annotated[
        int | None,
        Field(
            ge=1,
            description="candidates per anchor: its range_max nearest other rows "
            "(pairs: its range_max + p nearest distinct texts, p the most positives an anchor "
            "has, its own positives then masked; sentence-transformers' range_max); null: "
            "range_min + num_negatives (× 10 when a margin or max_score is set) + p "
            "(unlabelled: p = 1), as sentence-transformers derives it",
        ),
    ] = 30
    max_score: Annotated[
        float | None,
        Field(
            ge=-1,
            le=1,
            description="skip candidates whose similarity is above this (> max_score; kept: "
            "≤), before range_min counts, as sentence-transformers' max_score; null: no cap",
        ),
    ] = None
    min_score: Annotated[
        float | None,
        Field(
            ge=-1,
            le=1,
            description="skip candidates whose similarity is below this (< min_score; kept: "
            "≥), before range_min counts, as sentence-transformers' min_score; null: no floor",
        ),
    ] = None
    # 0.05 is NV-Retriever's TopK-PercPos (95%), the setting sentence-transformers recommends.
    relative_margin: Annotated[
        float | None,
        Field(
            ge=0,
            lt=1,
            description="keep a negative only if its similarity ≤ the positive's − |the "
            "positive's| × relative_margin (pairs: anchor·positive; unlabelled: 1.0, the "
            "anchor's own second view, and < instead of ≤); removes likely false negatives; "
            "null: no relative margin",
        ),
    ] = 0.05
    absolute_margin: Annotated[
        float | None,
        Field(
            ge=0,
            description="keep a negative only if its similarity + absolute_margin ≤ the "
            "positive's (unlabelled: < 1.0); null: no absolute margin",
        ),
    ] = None
    sampling_strategy: Annotated[
        Literal["top", "random"],
        Field(
            description="top: the num_negatives most similar candidates that pass, after "
            "range_min; random: num_negatives drawn at random (seeded by `seed`, the anchor and "
            "each candidate, so independent of sharding) from those that pass, after range_min, "
            "up to rank range_max among them; written most similar first "
            "(sentence-transformers' sampling_strategy)",
        ),
    ] = "top"
    seed: Annotated[
        int,
        Field(
            ge=0,
            description="sampling_strategy random: the seed of every anchor's draw (a rerun "
            "with the same seed gives the same negatives)",
        ),
    ] = 0
    skip_same_document: Annotated[
        bool,
        Field(
            description="never take a negative from the anchor's own document (document "
            "corpora whose shards have a document column: its sentences are likely positives)"
        ),
    ] = True
    exact: Annotated[
        bool,
        Field(
            description="find neighbours by a brute-force scan of every shard instead of the "
            "index (exact; reads every shard's vectors per task)"
        ),
    ] = False
    ef_search: Annotated[
        int | None,
        Field(ge=1, description="HNSW candidates per query; null: the index's own (index.json)"),
    ] = None
    cpus_per_task: Annotated[
        float, Field(gt=0, description="CPUs of each mining task (one task per shard)")
    ] = 1.0
    stall_timeout_s: Annotated[
        float | None,
        Field(
            gt=0,
            description="fail, naming the resources, when the tasks have waited this long for "
            "resources that never free; null: wait forever",
        ),
    ] = DEFAULT_STALL_TIMEOUT_S
    ray: RayConfig = field(default_factory=RayConfig)

    def validate(self) -> None:
        """What the declarations cannot say: the window holds the negatives asked for, and
        min_score ≤ max_score."""
        if self.embeddings is None:
            raise ConfigError("embeddings: required: the embedding output directory to mine")
        if self.anchors is not None and self.anchors.rstrip("/") == self.embeddings.rstrip("/"):
            raise ConfigError(
                "anchors: the same output as embeddings: pairs are mined from two outputs of "
                "one pair table (its anchor and its positive column); for an unlabelled corpus "
                "set anchors=null"
            )
        if (
            self.min_score is not None
            and self.max_score is not None
            and self.min_score > self.max_score
        ):
            raise ConfigError(
                f"min_score: must be ≤ max_score ({self.max_score}), got {self.min_score}: no "
                "candidate could pass both"
            )
        if self.range_max is not None:  # null: derived, and then it holds the negatives
            if self.range_min >= self.range_max:
                raise ConfigError(
                    f"range_min: must be < range_max ({self.range_max}), got {self.range_min}"
                )
            if self.num_negatives > self.range_max - self.range_min:
                raise ConfigError(
                    f"num_negatives: {self.num_negatives} do not fit the window: only "
                    f"range_max − range_min = {self.range_max - self.range_min} candidates "
                    "are taken; lower num_negatives or range_min, or raise range_max"
                )
        validate_ray_config(self.ray)

    def window_max(self, max_positives: int = 1) -> int:
        """range_max, or where it is null sentence-transformers' derivation: range_min +
        num_negatives (× 10 when a margin or max_score may remove candidates) + the most
        positives an anchor has (unlabelled: 1, its own second view)."""
        if self.range_max is not None:
            return self.range_max
        filtered = any(
            value is not None
            for value in (self.absolute_margin, self.relative_margin, self.max_score)
        )
        return self.range_min + self.num_negatives * (10 if filtered else 1) + max_positives
