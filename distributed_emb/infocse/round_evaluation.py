"""How the rounds score a model and choose among them: evaluate → choose.

Every candidate (the initial model, each round's, a teacher for reference, a compared arm) is
scored the same way, in the driver (:func:`evaluate_dev`); `rounds.select_by` names the one
score that chooses the export and counts rounds without gain (:func:`standing`). The overlap
thread asks the same stopping rule whether a checkpoint would let a next round run
(:func:`next_round_follows`). Kept together so that what is scored and what chooses cannot
drift apart.
"""

from __future__ import annotations

from distributed_emb import storage
from distributed_emb.evaluation.beir import evaluate_split, evaluate_splits
from distributed_emb.evaluation.document_retrieval import evaluate_same_document
from distributed_emb.evaluation.retrieval import evaluate_retrieval, sts_retrieval_task
from distributed_emb.evaluation.sts import read_stsb, sts_spearman, stsb_score
from distributed_emb.evaluation.yardsticks import passage_length
from distributed_emb.infocse.held_out_documents import HeldOut
from distributed_emb.infocse.round_records import RoundRecord
from distributed_emb.infocse.rounds_config import InfoCSEConfig
from distributed_emb.model.embedder import Embedder, EmbeddingLookup
from distributed_emb.model.sentence_transformer import is_sentence_transformer_dir
from distributed_emb.selection import STSB_DEV, describe, documents_split, retrieval_split

# Evaluate ------------------------------------------------------------------------------------


def round_embedder(
    model_dir: str, config: InfoCSEConfig, max_seq_length: int | None = None
) -> Embedder:
    """A round's model (or the start, or a compared arm) as the rounds score it: in this
    process, with the training's pooler (unless the directory carries its own), evaluation
    batch and training length (or `max_seq_length`: passages of documents)."""
    training = config.training
    local = storage.local_model_dir(model_dir)
    return Embedder(
        local,
        pooler=None if is_sentence_transformer_dir(local) else training.model.pooler,
        batch_size=training.eval.batch_size,
        max_seq_length=max_seq_length or training.model.max_seq_length,
        device="cpu",
    )


def evaluate_dev(model_dir: str, config: InfoCSEConfig, heldout: HeldOut | None = None) -> dict:
    """STS-B dev Spearman and STS-B-dev retrieval of an exported model (in-process), plus
    same-document retrieval on both halves of the held-out documents, nDCG@10 on the
    eval.select_by split of eval.retrieval_dir, and STS-B test when asked."""
    training = config.training
    embedder = round_embedder(model_dir, config)
    dev = read_stsb("dev", training.eval.senteval_dir, training.eval.max_pairs)
    # The retrieval set is made of STS-B dev sentences: each is embedded once, for both.
    dev_embeddings = EmbeddingLookup.encode_all(dev.sentences1 + dev.sentences2, embedder.embed)
    retrieval = evaluate_retrieval(
        dev_embeddings, sts_retrieval_task(dev, config.rounds.retrieval_threshold)
    )
    scores = {
        "stsb_dev": sts_spearman(dev_embeddings, dev),
        "retrieval_mrr": retrieval["mrr"],
        "retrieval_recall_at_1": retrieval["recall@1"],
    }
    if heldout is not None and heldout.dev is not None:
        held = evaluate_same_document(embedder.embed, heldout.dev)
        scores["heldout_dev_mrr"] = held["mrr"]
        scores["heldout_dev_recall_at_1"] = held["recall@1"]
    if heldout is not None and heldout.test is not None:
        held = evaluate_same_document(embedder.embed, heldout.test)
        scores["heldout_mrr"] = held["mrr"]
        for k in (1, 5, 10):
            scores[f"heldout_recall_at_{k}"] = held[f"recall@{k}"]
    split = retrieval_split(training.eval.select_by) or "dev"
    if training.eval.retrieval_dir is not None:  # the user's set, or the shipped news set
        own = evaluate_split(embedder.embed, training.eval.retrieval_dir, split)
        scores["eval_retrieval_ndcg_at_10"] = own["metrics"]["ndcg@10"]
    if heldout is not None and heldout.documents_dir is not None:
        # Passages are embedded whole (eval.documents_max_seq_length), not at the training
        # length.
        passages = round_embedder(model_dir, config, passage_length(training.eval, model_dir))
        topic = evaluate_splits(
            passages.embed, storage.local_model_dir(heldout.documents_dir), ["dev", "test"]
        )
        for name, result in topic.items():
            scores[f"documents_{name}_ndcg_at_10"] = result["metrics"]["ndcg@10"]
    if config.rounds.stsb_test:
        scores["stsb_test"] = stsb_score(embedder.embed, "test", training.eval.senteval_dir)
    return scores


def scores_line(scores: dict) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in scores.items() if v is not None)


# Choose --------------------------------------------------------------------------------------


def selection_field(config: InfoCSEConfig) -> str:
    """The RoundRecord field rounds are chosen and stopped on: rounds.select_by's, where
    "eval" is eval.select_by's (STS-B dev, or the eval.retrieval_dir split's nDCG@10)."""
    if config.rounds.select_by != "eval":
        return config.rounds.select_by
    if documents_split(config.training.eval.select_by) is not None:
        return "documents_dev_ndcg_at_10"
    if retrieval_split(config.training.eval.select_by) is None:
        return STSB_DEV
    return "eval_retrieval_ndcg_at_10"


def selection_name(config: InfoCSEConfig) -> str:
    """What chooses, in words for log lines: "STS-B dev Spearman", "nDCG@10 on retrieval
    dev", "same-document MRR on the held-out dev documents"."""
    select_by = config.rounds.select_by
    if select_by == "heldout_dev_mrr":
        return "same-document MRR on the held-out dev documents"
    return describe(config.training.eval.select_by if select_by == "eval" else select_by)


def selection_score(record: RoundRecord, config: InfoCSEConfig) -> float:
    """The dev score rounds are chosen and stopped on (rounds.select_by)."""
    return getattr(record, selection_field(config))


def standing(records: list[RoundRecord], config: InfoCSEConfig) -> tuple[RoundRecord, int]:
    """(the best record so far, rounds since it without a new best) under the stopping rule:
    each round is judged by its last record (its supervised step, with InfoCSE++)."""
    best, without_gain = records[0], 0
    last_of_round = {r.round: r for r in records[1:]}
    for record in (last_of_round[i] for i in sorted(last_of_round)):
        score, best_score = selection_score(record, config), selection_score(best, config)
        if score > best_score + config.rounds.min_improvement:
            best, without_gain = record, 0
        else:
            without_gain += 1
    return best, without_gain


def next_round_follows(config: InfoCSEConfig, best_dev: float, rounds_without_gain: int):
    """Would a next round run if this round's model were the checkpoint reported? The
    stopping rule of the rounds applied to the in-training selection score (eval.select_by),
    which is the round's own score when the rounds choose on that same score: the whole
    retrieval split of rounds.select_by=eval, or STS-B dev with eval.max_pairs unset;
    otherwise (held-out retrieval, a subset of STS-B dev, or rounds and training choosing on
    different scores) it is not comparable, and every report is worth mining."""
    r, e = config.rounds, config.training.eval
    field = selection_field(config)
    comparable = (field == STSB_DEV and e.select_by == STSB_DEV and e.max_pairs is None) or (
        field == "eval_retrieval_ndcg_at_10"
    )
    if not comparable or rounds_without_gain + 1 < r.patience:
        return lambda report: True
    return lambda report: report.score > best_dev + r.min_improvement
