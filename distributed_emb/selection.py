"""What a run chooses on (`eval.select_by`): the one score every evaluation reports under
SELECT_METRIC, and the one rule that picks the best evaluation from a history.

STS-B dev Spearman by default; `retrieval:<split>` makes it nDCG@10 on that split of the
user's own BEIR directory (`eval.retrieval_dir`), `documents:<split>` nDCG@10 on that split of
the document-level yardstick (`eval.documents_dir`: topic retrieval on held-out documents,
evaluation/document_topics.py). Every place that chooses (the kept and
exported checkpoint, metrics.json's best, the model card, Tune's metric and its best trial,
InfoCSE's overlapped mining) reads SELECT_METRIC, so none of them needs to know which score
it is. No torch or Ray here: the model card and config validation import it on the driver.
"""

from __future__ import annotations

from distributed_emb.checks import ConfigError

DEV_METRIC = "stsb_dev_spearman"  # STS-B dev Spearman × 100, reported at every evaluation
SELECT_METRIC = "select_score"  # the score eval.select_by names, at every evaluation
SELECT_BY = "select_by"  # the eval.select_by it was, beside it in every evaluation's metrics
STSB_DEV = "stsb_dev"
# eval.select_by's default: the in-domain dev set the run has, else STS-B dev (resolve_auto).
AUTO = "auto"
RETRIEVAL = "retrieval:"
DOCUMENTS = "documents:"
TEST_SPLIT = "test"
TRAIN_SPLIT = "train"


def retrieval_metric(split: str) -> str:
    """The evaluation key of nDCG@10 × 100 on `split` of eval.retrieval_dir. No "@" in it:
    MLflow refuses metric names with one (and the sink that raised would be dropped)."""
    return f"retrieval_{split}_ndcg_at_10"


def documents_metric(split: str) -> str:
    """The evaluation key of nDCG@10 × 100 on `split` of eval.documents_dir."""
    return f"documents_{split}_ndcg_at_10"


def retrieval_split(select_by: str) -> str | None:
    """`retrieval:dev` → `dev`; None when selection is on STS-B dev or documents."""
    return select_by[len(RETRIEVAL) :] if select_by.startswith(RETRIEVAL) else None


def documents_split(select_by: str) -> str | None:
    """`documents:dev` → `dev`; None when selection is on anything else."""
    return select_by[len(DOCUMENTS) :] if select_by.startswith(DOCUMENTS) else None


def selected_metric(select_by: str) -> str:
    """The evaluation key SELECT_METRIC copies: DEV_METRIC, or the split's nDCG@10."""
    split = retrieval_split(select_by)
    if split is not None:
        return retrieval_metric(split)
    split = documents_split(select_by)
    return DEV_METRIC if split is None else documents_metric(split)


def describe(select_by: str) -> str:
    """In words, for log lines and reports: "STS-B dev Spearman", "nDCG@10 on retrieval dev",
    "nDCG@10 on held-out documents dev"."""
    split = retrieval_split(select_by)
    if split is not None:
        return f"nDCG@10 on retrieval {split}"
    split = documents_split(select_by)
    return "STS-B dev Spearman" if split is None else f"nDCG@10 on held-out documents {split}"


def check_select_by(
    select_by: str,
    retrieval_dir: str | None,
    splits: list[str] | None,
    key: str = "eval",
    documents_dir: str | None = None,
    documents_splits: list[str] | None = None,
) -> None:
    """`eval.select_by` against the directory it names (`eval.retrieval_dir` or
    `eval.documents_dir`) and the splits its qrels/ holds (None: not listed, e.g. on object
    storage, or built by the run itself). Test splits are never chosen on."""
    if select_by == STSB_DEV:
        return
    split, prefix, directory, present, dir_key = (
        (retrieval_split(select_by), RETRIEVAL, retrieval_dir, splits, "retrieval_dir")
        if select_by.startswith(RETRIEVAL)
        else (documents_split(select_by), DOCUMENTS, documents_dir, documents_splits,
              "documents_dir")
    )  # fmt: skip
    if not split:
        raise ConfigError(
            f"{key}.select_by: {select_by!r} is not {STSB_DEV!r}, {RETRIEVAL}<split> "
            f"(e.g. {RETRIEVAL}dev: nDCG@10 on qrels/dev.tsv of {key}.retrieval_dir) or "
            f"{DOCUMENTS}<split> (e.g. {DOCUMENTS}dev: nDCG@10 on the held-out documents' dev "
            f"split, {key}.documents_dir)"
        )
    if split == TEST_SPLIT:
        raise ConfigError(
            f"{key}.select_by: {select_by}: test splits are reported, never used to choose; "
            f"choose on a dev split ({prefix}dev)"
        )
    if directory is None:
        raise ConfigError(
            f"{key}.select_by: {select_by} needs {key}.{dir_key} (a BEIR directory: "
            "corpus.jsonl, queries.jsonl, qrels/<split>.tsv)"
        )
    if present is not None and split not in present:
        raise ConfigError(
            f"{key}.select_by: {directory}/qrels has no {split}.tsv; its splits: "
            f"{', '.join(present) or 'none'}"
        )


def resolve_auto(select_by: str, retrieval_splits: list[str] | None, builds_documents: bool) -> str:
    """What `auto` chooses on: the user's own BEIR dev split where eval.retrieval_dir has
    one (labelled, in-domain: it goes first); else the dev split of the run's own held-out
    documents where it trains on documents (documents.paths, InfoCSE); else STS-B dev, the
    choice only where nothing in-domain exists. Any other value is returned as given."""
    if select_by != AUTO:
        return select_by
    if retrieval_splits is not None and "dev" in retrieval_splits:
        return f"{RETRIEVAL}dev"
    if builds_documents:
        return f"{DOCUMENTS}dev"
    return STSB_DEV


def scored_splits(splits: list[str], select_by: str, documents: bool = False) -> list[str]:
    """The splits every in-training evaluation scores (of eval.retrieval_dir, or with
    `documents` of eval.documents_dir): the one eval.select_by names and every other but test
    (reported on the exported model, never watched while choosing) and train (training
    labels, often the largest split: MS MARCO's has 500k queries)."""
    chosen = documents_split(select_by) if documents else retrieval_split(select_by)
    return [s for s in splits if s == chosen or s not in (TEST_SPLIT, TRAIN_SPLIT)]


def best_row(history: list[dict], start_is_candidate: bool = True) -> dict | None:
    """The evaluation a run exports: the highest SELECT_METRIC, the step-0 one only when it
    may win; on a tie the later step (the one Ray Train keeps: it ranks equal scores by
    report order)."""
    rows = [
        row
        for row in history
        if row.get(SELECT_METRIC) is not None and (start_is_candidate or row.get("step", 0) > 0)
    ]
    return max(rows, key=lambda row: (row[SELECT_METRIC], row.get("step", 0)), default=None)


# The start of the one line a run says when the model it hands back is the one it was given
# (metrics.json's and rounds.json's "exported" begin with it): a default never hands back
# the given model, or a weaker one, without saying so.
GIVEN_MODEL_UNCHANGED = "exported: the given model unchanged"


def given_model_line(what: str, best_trained: dict | None, start_score: float) -> str:
    """The line of a training run whose chosen evaluation is the start (step 0): `what` chose
    (describe(select_by)); `best_trained`: the best trained evaluation (a history row), None
    when no trained step was scored."""
    if best_trained is None:
        return f"{GIVEN_MODEL_UNCHANGED} — no trained step was scored on {what}"
    return (
        f"{GIVEN_MODEL_UNCHANGED} — no trained step beat it on {what} (best trained "
        f"{best_trained[SELECT_METRIC]:.2f} at step {best_trained.get('step')} vs "
        f"{start_score:.2f} at the start)"
    )


def exported_evaluation(
    history: list[dict], select_by: str, start_is_candidate: bool
) -> str | None:
    """What metrics.json's "exported" says: "step <s>", or given_model_line when the start
    won; None when no evaluation chose (the export is then the last checkpoint)."""
    chosen = best_row(history, start_is_candidate)
    if chosen is None:
        return None
    if chosen.get("step", 0) > 0:
        return f"step {chosen['step']}"
    best_trained = best_row(history, start_is_candidate=False)
    return given_model_line(describe(select_by), best_trained, chosen[SELECT_METRIC])


def given_model_round_line(
    what: str,
    best_round: int | None,
    best_score: float | None,
    start_score: float,
    min_improvement: float = 0.0,
) -> str:
    """The line of InfoCSE rounds whose best record is round 0, the given model itself (no
    student): `what` chose the rounds; round `best_round` scored best of the trained ones
    (None: no round ran). `min_improvement`: rounds.min_improvement, the gain a round
    needed."""
    margin = f" by more than {min_improvement:g}" if min_improvement > 0 else ""
    if best_round is None:
        return f"{GIVEN_MODEL_UNCHANGED} — no round was trained"
    return (
        f"{GIVEN_MODEL_UNCHANGED} — no round beat it on {what}{margin} (best round "
        f"{best_round}: {best_score:.2f} vs {start_score:.2f})"
    )


def is_given_model(exported: str | None) -> bool:
    """Does an "exported" entry say the given model was handed back unchanged?"""
    return bool(exported) and exported.startswith(GIVEN_MODEL_UNCHANGED)
