"""What a training run evaluates and selects by (`eval.*`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from distributed_emb.checks import ConfigError
from distributed_emb.settings import section


@section
class EvalConfig:
    eval_steps: Annotated[
        int, Field(ge=1, description="evaluate STS-B dev (and checkpoint) every N steps")
    ] = 50
    senteval_dir: Annotated[
        str | None, Field(description="SentEval data directory; null: the shipped STS-B")
    ] = None
    max_pairs: Annotated[
        int | None,
        Field(ge=3, description="evaluate on the first N STS-B dev pairs (quick runs; Spearman)"),
    ] = None
    batch_size: Annotated[int, Field(ge=1, description="sentences per evaluation batch")] = 128
    test_after_training: Annotated[
        bool,
        Field(description="score the exported model on STS-B test (needs it in eval.senteval_dir)"),
    ] = True
    # True for a single run (never ship worse than the start); InfoCSE rounds set False: a
    # round's model is what its training produced, and the rounds compare it with the start.
    start_is_candidate: Annotated[
        bool,
        Field(
            description="may the starting model (step 0) be the one exported when no trained "
            "step beats it"
        ),
    ] = True
    # InfoCSE rounds and the side-by-side arms set False: their start was scored already, and
    # the pass is a whole dev evaluation.
    score_start: Annotated[
        bool, Field(description="score the starting model (step 0) before training")
    ] = True
    # selection.py: what chooses is one reported score (select_score), whichever it is.
    retrieval_dir: Annotated[
        str | None,
        Field(
            description="a BEIR directory (corpus.jsonl, queries.jsonl, qrels/<split>.tsv) "
            "every evaluation also scores: nDCG@10 × 100 of each split but train and test, "
            "as retrieval_<split>_ndcg_at_10; every worker reads it"
        ),
    ] = None
    select_by: Annotated[
        str,
        Field(
            description="what chooses the exported checkpoint (and Tune's best trial): "
            "stsb_dev (STS-B dev Spearman), or retrieval:<split> (nDCG@10 on that split of "
            "eval.retrieval_dir, e.g. retrieval:dev; never test); STS-B dev is reported "
            "either way"
        ),
    ] = "stsb_dev"


def validate_selection(e: EvalConfig) -> None:
    """eval.select_by names STS-B dev or a split that eval.retrieval_dir holds (not test)."""
    from distributed_emb.selection import check_select_by

    splits = None
    if e.retrieval_dir is not None:
        from distributed_emb.data.beir_layout import BeirDataError, list_splits

        try:
            splits = list_splits(e.retrieval_dir)
        except BeirDataError as error:
            raise ConfigError(f"eval.retrieval_dir: {error}") from None
    check_select_by(e.select_by, e.retrieval_dir, splits)
