"""Both yardsticks of an exported model against the given model, on test splits, with paired
intervals: paraphrase ("does this sentence say the same thing?": STS-B test, SICK-R where
eval.senteval_dir holds it, and the test split of eval.retrieval_dir, e.g. the shipped news
set) and topic (the held-out documents' test split, evaluation/document_topics.py: "is this
passage about the same thing?"). The two can move in opposite directions, so every run
reports both, one line each, and says so in one line when its export is below the given model
on topic beyond the interval (:func:`topic_loss_line`), as it says when it hands back the
given model.

Used by the training job's metrics.json and console (train/driver.py) and InfoCSE's
rounds.json (infocse/round_export.py); the card carries the same lines.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from distributed_emb.data.beir_layout import list_splits
from distributed_emb.evaluation.beir import evaluate_splits
from distributed_emb.evaluation.eval_config import EvalConfig
from distributed_emb.evaluation.paired_bootstrap import (
    PairedDifference,
    paired_mean_difference,
    paired_spearman_difference,
)
from distributed_emb.evaluation.senteval_data import SentEvalDataError, read_sick_relatedness
from distributed_emb.evaluation.sts import read_stsb, sts_cosines
from distributed_emb.model.model_card import position_limit
from distributed_emb.storage import local_model_dir

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
    """{"paraphrase": {"stsb_test": D, "sickr_test": D, "retrieval_test": {metric: D}},
    "topic": {"documents_test": {metric: D}, ...}} with each D a PairedDifference.as_dict()
    (exported − given); a yardstick whose data is absent is left out (STS-B test, logged). The
    given model is encoded the same way as the export."""
    models = (given_model, exported_model)
    paraphrase: dict[str, dict] = {}
    readers = {
        "stsb_test": lambda: read_stsb(TEST, e.senteval_dir),
        "sickr_test": lambda: read_sick_relatedness(e.senteval_dir, TEST),
    }
    for key, read in readers.items():
        if key == "sickr_test" and e.senteval_dir is None:
            continue  # the shipped SentEval copy holds STS-B alone
        try:
            data = read()
        except (SentEvalDataError, FileNotFoundError) as error:
            log.warning("no %s yardstick: %s", key, error)
            continue
        given, exported = (sts_cosines(encoder_for(model, None), data) for model in models)
        paraphrase[key] = paired_spearman_difference(data.scores, given, exported).as_dict()
    if e.retrieval_dir is not None:
        directory = local_model_dir(e.retrieval_dir)
        if TEST in list_splits(directory):
            runs = [evaluate_splits(encoder_for(m, None), directory, [TEST])[TEST] for m in models]
            paraphrase["retrieval_test"] = _paired_metrics(*runs)
            paraphrase["retrieval_dir"] = e.retrieval_dir
    out: dict[str, dict] = {PARAPHRASE: paraphrase} if paraphrase else {}
    if e.documents_dir is not None:
        directory = local_model_dir(e.documents_dir)
        runs = [
            evaluate_splits(encoder_for(m, passage_length(e, m)), directory, [TEST])[TEST]
            for m in models
        ]
        out[TOPIC] = {
            "documents_test": _paired_metrics(*runs),
            "n_queries": runs[0]["n_queries"],
            "documents_dir": e.documents_dir,
        }
    return out


def _paired_metrics(given: dict, exported: dict) -> dict[str, dict]:
    """Each retrieval metric of two runs of one split, exported − given, the queries paired."""
    per_given, per_exported = given["per_query"], exported["per_query"]
    return {
        metric: paired_mean_difference(
            [per_given[metric][q] for q in per_given[metric]],
            [per_exported[metric][q] for q in per_given[metric]],
        ).as_dict()
        for metric in (TOPIC_METRIC, "recall@1", "recall@10", "mrr@10")
    }


def passage_length(e: EvalConfig, model_dir: str) -> int:
    """The tokens a passage of eval.documents_dir is embedded with by `model_dir`:
    eval.documents_max_seq_length, at most what its position embeddings take."""
    limit = position_limit(local_model_dir(model_dir))
    return min(e.documents_max_seq_length, limit or e.documents_max_seq_length)


def yardstick_lines(compared: dict) -> list[str]:
    """One line per yardstick: the given model's score, the export's, the difference and its
    interval (``*``: it excludes 0)."""
    lines = []
    paraphrase = compared.get(PARAPHRASE, {})
    for key, what in (("stsb_test", "STS-B test Spearman"), ("sickr_test", "SICK-R Spearman")):
        if key in paraphrase:
            d = PairedDifference.from_dict(paraphrase[key])
            lines.append(f"paraphrase:       {what} {_move(d)}")
    if "retrieval_test" in paraphrase:
        d = PairedDifference.from_dict(paraphrase["retrieval_test"][TOPIC_METRIC])
        lines.append(f"paraphrase:       {paraphrase['retrieval_dir']} test nDCG@10 {_move(d)}")
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
PARAPHRASE_LOSS = "warning: the export is below the given model on paraphrase"


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


def paraphrase_loss_line(compared: dict) -> str | None:
    """The one line a run says when its export lost STS-B test beyond the interval (a run
    chosen on topic may trade paraphrase for it: InfoCSE's rounds do); None otherwise."""
    stsb = compared.get(PARAPHRASE, {}).get("stsb_test")
    if stsb is None:
        return None
    d = PairedDifference.from_dict(stsb)
    if d.high >= 0:
        return None
    return (
        f"{PARAPHRASE_LOSS} — STS-B test Spearman {d.format()} (95% paired interval); where "
        "your queries are paraphrases, choose on them (eval.select_by=stsb_dev, or your own "
        "labelled set: eval.retrieval_dir)"
    )


def warning_lines(compared: dict) -> list[str]:
    """What the run says, one line each, about a yardstick on which its export fell below
    the given model beyond the interval."""
    return [line for line in (topic_loss_line(compared), paraphrase_loss_line(compared)) if line]
