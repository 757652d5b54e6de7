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
    # The document-level yardstick (evaluation/document_topics.py): "is this passage about
    # the same thing?", which can move against STS's "does it say the same thing?". Reported
    # beside STS-B at every evaluation and for the export against the given model.
    documents_dir: Annotated[
        str | None,
        Field(
            description="topic retrieval on held-out documents, in the BEIR layout "
            "(evaluation/document_topics.py): every evaluation scores its dev split "
            "(documents_dev_ndcg_at_10) and the export is compared with the given model on "
            "its test split; the shipped example by default (held-out Lee news documents); "
            "a run that trains on documents (InfoCSE, documents.paths) builds its own from "
            "its held-out documents; null: none"
        ),
    ] = "shipped:news-documents"
    # Passages are several sentences: cut at the training length (often 32 tokens) they
    # would be scored on their first sentence.
    documents_max_seq_length: Annotated[
        int,
        Field(
            ge=8,
            description="tokens a passage of eval.documents_dir is embedded with (at most the "
            "model's position limit)",
        ),
    ] = 256
    select_by: Annotated[
        str,
        Field(
            description="what chooses the exported checkpoint (and Tune's best trial): "
            "stsb_dev (STS-B dev Spearman), retrieval:<split> (nDCG@10 on that split of "
            "eval.retrieval_dir, e.g. retrieval:dev) or documents:<split> (nDCG@10 on that "
            "split of eval.documents_dir, e.g. documents:dev); never test. auto: retrieval:dev "
            "when eval.retrieval_dir has a dev split, else documents:dev when the run trains "
            "on documents (documents.paths, InfoCSE), else stsb_dev. STS-B dev and the "
            "documents' dev split are reported either way"
        ),
    ] = "auto"


def validate_selection(e: EvalConfig, builds_documents: bool = False) -> str:
    """eval.select_by, `auto` resolved (selection.resolve_auto), checked: it names STS-B dev
    or a split that eval.retrieval_dir or eval.documents_dir holds (not test).
    `builds_documents`: the run writes its own eval.documents_dir from its held-out documents
    (its splits are dev and test). Returns the resolved value."""
    from distributed_emb.selection import check_select_by, resolve_auto

    def splits_of(key: str, directory: str | None) -> list[str] | None:
        if directory is None or "://" in directory:
            return None
        from distributed_emb.data.beir_layout import BeirDataError, list_splits

        try:
            return list_splits(directory)
        except BeirDataError as error:
            raise ConfigError(f"eval.{key}: {error}") from None

    documents_dir, documents_splits = e.documents_dir, splits_of("documents_dir", e.documents_dir)
    if builds_documents:
        documents_dir, documents_splits = "the run's held-out documents", ["dev", "test"]
    retrieval_splits = splits_of("retrieval_dir", e.retrieval_dir)
    select_by = resolve_auto(e.select_by, retrieval_splits, builds_documents)
    check_select_by(
        select_by,
        e.retrieval_dir,
        retrieval_splits,
        documents_dir=documents_dir,
        documents_splits=documents_splits,
    )
    return select_by
