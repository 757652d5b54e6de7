"""Both yardsticks of an exported model against the given model, on test splits, with paired
intervals: paraphrase (STS-B test: "does this sentence say the same thing?") and topic (the
held-out documents' test split, evaluation/document_topics.py: "is this passage about the
same thing?"). The two can move in opposite directions, so every run reports both, in one
line each, and says so in one line when its export is below the given model on topic beyond
the interval (:func:`topic_loss_line`), as it says when it hands back the given model.

Used by the training job's metrics.json and console (train/driver.py) and InfoCSE's
rounds.json (infocse/rounds.py); the card carries the same lines.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from distributed_emb.evaluation.beir import evaluate_splits
from distributed_emb.evaluation.eval_config import EvalConfig
from distributed_emb.evaluation.paired_bootstrap import (
    PairedDifference,
    paired_mean_difference,
    paired_spearman_difference,
)
from distributed_emb.evaluation.senteval_data import SentEvalDataError
from distributed_emb.evaluation.sts import read_stsb, sts_cosines

log = logging.getLogger(__name__)

Encoder = Callable[[list[str]], np.ndarray]
# (model directory, max_seq_length or None for the model's own) → an encoder.
EncoderFactory = Callable[[str, int | None], Encoder]

PARAPHRASE = "paraphrase"
TOPIC = "topic"
TOPIC_METRIC = "ndcg@10"  # the topic line's headline; the others are kept beside it
TEST = "test"


def compare_with_given(
    given_model: str, exported_model: str, e: EvalConfig, encoder_for: EncoderFactory
) -> dict:
    """{"paraphrase": {"stsb_test": D}, "topic": {"documents_test": {metric: D}}} with each D a
    PairedDifference.as_dict() (exported − given); a yardstick whose data is absent is left
    out and logged. The given model is encoded the same way as the export."""
    out: dict[str, dict] = {}
    try:
        stsb = read_stsb(TEST, e.senteval_dir)
    except SentEvalDataError as error:
        log.warning("no STS-B test yardstick: %s", error)
    else:
        given, exported = (
            sts_cosines(encoder_for(model, None), stsb) for model in (given_model, exported_model)
        )
        out[PARAPHRASE] = {
            "stsb_test": paired_spearman_difference(stsb.scores, given, exported).as_dict()
        }
    if e.documents_dir is not None:
        from distributed_emb.storage import local_model_dir

        directory = local_model_dir(e.documents_dir)
        given, exported = (
            evaluate_splits(encoder_for(model, passage_length(e, model)), directory, [TEST])
            for model in (given_model, exported_model)
        )
        per_query_given, per_query_exported = given[TEST]["per_query"], exported[TEST]["per_query"]
        out[TOPIC] = {
            "documents_test": {
                metric: paired_mean_difference(
                    [per_query_given[metric][q] for q in per_query_given[metric]],
                    [per_query_exported[metric][q] for q in per_query_given[metric]],
                ).as_dict()
                for metric in (TOPIC_METRIC, "recall@1", "recall@10", "mrr@10")
            },
            "n_queries": given[TEST]["n_queries"],
            "documents_dir": e.documents_dir,
        }
    return out


def passage_length(e: EvalConfig, model_dir: str) -> int:
    """The tokens a passage of eval.documents_dir is embedded with by `model_dir`:
    eval.documents_max_seq_length, at most what its position embeddings take."""
    from distributed_emb.model.model_card import position_limit
    from distributed_emb.storage import local_model_dir

    limit = position_limit(local_model_dir(model_dir))
    return min(e.documents_max_seq_length, limit or e.documents_max_seq_length)


def yardstick_lines(compared: dict) -> list[str]:
    """One line per yardstick: the given model's score, the export's, the difference and its
    interval (``*``: it excludes 0)."""
    lines = []
    if PARAPHRASE in compared:
        d = PairedDifference.from_dict(compared[PARAPHRASE]["stsb_test"])
        lines.append(f"paraphrase:       STS-B test Spearman {_move(d)}")
    if TOPIC in compared:
        d = PairedDifference.from_dict(compared[TOPIC]["documents_test"][TOPIC_METRIC])
        lines.append(
            f"topic:            held-out documents test nDCG@10 {_move(d)} "
            f"({compared[TOPIC]['n_queries']} queries)"
        )
    return lines


def _move(d: PairedDifference) -> str:
    star = " *" if d.excludes_zero() else ""
    return f"{d.baseline:.2f} → {d.candidate:.2f}, {d.format()}{star} vs the given model"


TOPIC_LOSS = "warning: the export is below the given model on topic"


def topic_loss_line(compared: dict) -> str | None:
    """The one line a run says when its export lost topic retrieval beyond the interval
    (docs/EVALUATION.md names the settings that avoid it); None otherwise."""
    if TOPIC not in compared:
        return None
    d = PairedDifference.from_dict(compared[TOPIC]["documents_test"][TOPIC_METRIC])
    if d.high >= 0:
        return None
    return (
        f"{TOPIC_LOSS} — held-out documents test nDCG@10 {d.format()} (95% paired interval); "
        "to keep it: loss.distill_weight=0.1 model.mlp_head=none, or train on your documents "
        "(documents.paths; docs/EVALUATION.md, 'Two yardsticks')"
    )
