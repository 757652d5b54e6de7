"""The rounds as records: one RoundRecord per round and stage, and every view of them: the
table (rounds.md and the console), the row each sends to the metrics sinks
(rounds_log.jsonl, TensorBoard), the plot (rounds.png) and rounds.json.

A module of its own because more than the loop reads them: a restarted run rebuilds its
records from rounds.json, the export names the chosen record, compare.py reads an arm's, and
the job prints the table. With a storage path, saving the records also puts the plot and the
sinks' files beside the rounds' state, so that they outlive the driver's node as each round
finishes.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from distributed_emb import storage
from distributed_emb.atomic_files import write_text_atomic
from distributed_emb.infocse.round_state import RoundState
from distributed_emb.infocse.rounds_config import InfoCSEConfig
from distributed_emb.plots import Panel, write_panels
from distributed_emb.tracking import LOGS_DIR, TENSORBOARD_DIR, MetricsSinks

log = logging.getLogger(__name__)

ROUNDS_LOG = "rounds_log.jsonl"
PLOT_FILE = "rounds.png"


@dataclass
class RoundRecord:
    round: int
    stage: str  # "initial", "infocse" or "supervised"
    model_dir: str
    pairs: int = 0
    documents_with_pairs: int = 0
    overlap_with_previous: float | None = None  # Jaccard of the two rounds' pair sets
    stsb_dev: float | None = None
    retrieval_mrr: float | None = None
    retrieval_recall_at_1: float | None = None
    train_steps: int = 0
    # The round's model is its training's best trained checkpoint by dev (kept_step);
    # last_step_dev is where training itself ended.
    kept_step: int = 0
    last_step_dev: float | None = None
    annotate_s: float = 0.0
    train_s: float = 0.0
    annotated_by: str | None = None  # "teacher" or "self" (the model trained this round)
    # Same-document retrieval on the held-out documents (heldout.*), × 100: the dev half
    # (rounds.select_by=heldout_dev_mrr chooses on it) and the test half (reported only).
    heldout_dev_mrr: float | None = None
    heldout_dev_recall_at_1: float | None = None
    heldout_mrr: float | None = None
    heldout_recall_at_1: float | None = None
    heldout_recall_at_5: float | None = None
    heldout_recall_at_10: float | None = None
    stsb_test: float | None = None  # rounds.stsb_test: reported, never used to choose
    # The document-level yardstick (evaluation/document_topics.py): topic retrieval among the
    # held-out documents' passages, nDCG@10 × 100 of the dev split (eval.select_by=
    # documents:dev chooses on it) and the test split (reported only).
    documents_dev_ndcg_at_10: float | None = None
    documents_test_ndcg_at_10: float | None = None
    # nDCG@10 × 100 on the split of eval.retrieval_dir that eval.select_by names (the user's
    # own dev set; rounds.select_by=eval chooses on it); None when eval.select_by is stsb_dev.
    eval_retrieval_ndcg_at_10: float | None = None
    # rounds.overlap: the previous round's training step whose checkpoint mined this round's
    # pairs while that training ran (None: mined after it, as sequential rounds do). Then
    # annotate_s is only the wait for them once that round was done; overlapped_annotate_s is
    # the annotation's own time.
    mined_at_step: int | None = None
    overlapped_annotate_s: float | None = None
    pairs_location: str | None = None  # where the round's pairs are (local or on storage)
    # The round's pairs were committed by an earlier attempt of this run: not mined again,
    # and its training continued from its own last checkpoint.
    resumed: bool = False


def record_from_row(row: dict) -> RoundRecord:
    """A record from its rounds.json row; keys a later version dropped are ignored."""
    known = {f.name for f in fields(RoundRecord)}
    return RoundRecord(**{k: v for k, v in row.items() if k in known})


def training_fields(metrics: dict) -> dict:
    """A record's fields from its training's metrics.json."""
    return {
        "train_steps": metrics.get("steps") or 0,
        "train_s": metrics.get("wall_time_s") or 0.0,
        "kept_step": metrics.get("best_step") or 0,
        "last_step_dev": metrics.get("stsb_dev_after"),
    }


_SCORE_FIELDS = (
    "stsb_dev",
    "heldout_dev_mrr",
    "heldout_dev_recall_at_1",
    "retrieval_mrr",
    "retrieval_recall_at_1",
    "heldout_mrr",
    "heldout_recall_at_1",
    "heldout_recall_at_5",
    "heldout_recall_at_10",
    "stsb_test",
    "eval_retrieval_ndcg_at_10",
    "documents_dev_ndcg_at_10",
    "documents_test_ndcg_at_10",
)


def score_fields(scores: dict) -> dict:
    """A record's fields from a model's scores (round_evaluation.evaluate_dev)."""
    return {k: scores[k] for k in _SCORE_FIELDS if k in scores}


# The table -----------------------------------------------------------------------------------

HEADER = (
    f"{'round':>5} {'stage':>10} {'annot by':>8} {'pairs':>7} {'overlap':>8} {'STS-B dev':>9} "
    f"{'MRR':>6} {'R@1':>6} {'dev MRR':>8} {'held MRR':>8} {'held R@1':>8} {'held R@10':>9} "
    f"{'STS-B test':>10} {'nDCG@10':>8} {'doc dev':>8} {'doc test':>8} "
    f"{'steps':>5} {'kept':>5} {'last dev':>8} {'annot s':>7} {'train s':>7} {'mined at':>8}"
)


def _cell(value: float | None, width: int, digits: int = 2) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def format_row(r: RoundRecord) -> str:
    overlap = "-" if r.overlap_with_previous is None else f"{r.overlap_with_previous:.3f}"
    last_dev = "-" if r.last_step_dev is None else f"{r.last_step_dev:.2f}"
    return (
        f"{r.round:>5} {r.stage:>10} {r.annotated_by or '-':>8} {r.pairs:>7} {overlap:>8} "
        f"{r.stsb_dev:>9.2f} {r.retrieval_mrr:>6.3f} {r.retrieval_recall_at_1:>6.3f} "
        f"{_cell(r.heldout_dev_mrr, 8)} {_cell(r.heldout_mrr, 8)} "
        f"{_cell(r.heldout_recall_at_1, 8)} {_cell(r.heldout_recall_at_10, 9)} "
        f"{_cell(r.stsb_test, 10)} {_cell(r.eval_retrieval_ndcg_at_10, 8)} "
        f"{_cell(r.documents_dev_ndcg_at_10, 8)} {_cell(r.documents_test_ndcg_at_10, 8)} "
        f"{r.train_steps:>5} "
        f"{r.kept_step:>5} {last_dev:>8} {r.annotate_s:>7.0f} {r.train_s:>7.0f} "
        f"{'-' if r.mined_at_step is None else r.mined_at_step:>8}"
    )


def format_table(records: list[RoundRecord]) -> str:
    return "\n".join([HEADER] + [format_row(r) for r in records])


def log_record(record: RoundRecord, sinks: MetricsSinks) -> None:
    """The record's table row on the console and run.log, its numbers to the sinks."""
    log.warning("InfoCSE %s", format_row(record))
    kind = "supervised" if record.stage == "supervised" else "rounds"
    numbers = {k: v for k, v in asdict(record).items() if k not in ("round", "stage")}
    sinks.log(record.round, numbers, kind)


# The plot ------------------------------------------------------------------------------------


def rounds_panels(records: list[RoundRecord]) -> list[Panel]:
    """The plot's charts, against the round (0: the initial model): STS-B dev, retrieval
    MRR and R@1 on the STS-B dev retrieval set, the pairs mined, and on the held-out
    documents same-document retrieval and the document-level yardstick (topic). InfoCSE++'s
    supervised steps are their own lines."""
    unsupervised = [r for r in records if r.stage != "supervised"]
    supervised = [r for r in records if r.stage == "supervised"]

    def points(rows, field_name):
        return [(r.round, getattr(r, field_name)) for r in rows]

    dev = {"InfoCSE": points(unsupervised, "stsb_dev")}
    retrieval = {
        "MRR": points(unsupervised, "retrieval_mrr"),
        "R@1": points(unsupervised, "retrieval_recall_at_1"),
    }
    if supervised:
        dev["InfoCSE++ (supervised)"] = points(supervised, "stsb_dev")
        retrieval["MRR, supervised"] = points(supervised, "retrieval_mrr")
        retrieval["R@1, supervised"] = points(supervised, "retrieval_recall_at_1")
    rounds = sorted({r.round for r in records})
    mined = [r for r in records if r.stage == "infocse"]
    panels = [
        Panel("STS-B dev Spearman", "round", dev, xticks=rounds),
        Panel("STS-B dev retrieval", "round", retrieval, xticks=rounds),
        Panel("pairs mined", "round", {"pairs": points(mined, "pairs")}, xticks=rounds),
    ]
    if any(r.heldout_mrr is not None for r in unsupervised):
        held = {
            "dev MRR": points(unsupervised, "heldout_dev_mrr"),
            "MRR": points(unsupervised, "heldout_mrr"),
            "R@1": points(unsupervised, "heldout_recall_at_1"),
            "R@10": points(unsupervised, "heldout_recall_at_10"),
        }
        panels.append(Panel("held-out documents: same-document retrieval", "round", held,
                            xticks=rounds))  # fmt: skip
    if any(r.documents_dev_ndcg_at_10 is not None for r in unsupervised):
        topic = {
            "dev": points(unsupervised, "documents_dev_ndcg_at_10"),
            "test": points(unsupervised, "documents_test_ndcg_at_10"),
        }
        panels.append(Panel("held-out documents: topic nDCG@10", "round", topic,
                            xticks=rounds))  # fmt: skip
    return panels


# rounds.json ---------------------------------------------------------------------------------


def rounds_summary(config: InfoCSEConfig, exported: str | None = None) -> dict:
    """rounds.json's account of the run beside its rounds: the regime (the given model
    trained whole, or a student cut from it) and, once exported, what the export is."""
    layers = config.student.num_layers
    summary = (
        {"regime": "student", "student_layers": layers}
        if layers is not None
        else {"regime": "given model"}
    )
    if exported is not None:
        summary["exported"] = exported
    return summary


def save_rounds(
    records: list[RoundRecord],
    best: RoundRecord,
    output: Path,
    state: RoundState,
    config: InfoCSEConfig,
    exported: str | None = None,
    yardsticks: dict | None = None,
) -> None:
    """rounds.json/.md in the rounds' state (what a restart reads) and the plot in the output
    directory. With a storage path, a copy of both files in the output directory beside the
    logs, and the plot and the sinks' files (rounds_log.jsonl, tensorboard/) in the state.
    `exported`: what the finished rounds exported (round_export.exported_line); `yardsticks`:
    the export against the given model (round_export.compare_export)."""
    table = format_table(records)
    summary = rounds_summary(config, exported)
    if yardsticks:
        summary["yardsticks"] = yardsticks
    state.save(config, records, best, table, summary)
    if state.remote:
        payload = {"rounds": [asdict(r) for r in records], "best": asdict(best), **summary}
        write_text_atomic(output / "rounds.json", json.dumps(payload, indent=2))
        write_text_atomic(output / "rounds.md", table + "\n")
    plot = write_panels(rounds_panels(records), output / PLOT_FILE, title="InfoCSE rounds")
    if state.remote:
        _copy_views(plot, output, state)


def _copy_views(plot: str | None, output: Path, state: RoundState) -> None:
    # The driver's output directory is one node's disk, which a cluster may take away: what
    # the user watches a run by goes beside the state (the sinks' files where a training's
    # own logs/ keeps them), rewritten whole at every save.
    if plot is not None:
        storage.copy_to_storage(plot, state.location(PLOT_FILE))
    for name in (ROUNDS_LOG, TENSORBOARD_DIR):
        if (output / name).exists():
            storage.copy_to_storage(output / name, state.location(LOGS_DIR, name))
