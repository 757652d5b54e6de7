"""Side by side at equal budget: SimCSE, InforMin-CL, InfoCSE self- and teacher-annotated,
distillation from the teacher.

    python jobs/compare_infocse.py --output runs/compare [--arms a,b] [key=value ...]

The settings are InfoCSE's (jobs/configs/infocse_default.yaml) plus `compare.*`, and they fix
what every arm shares: the student (`student.num_layers`, default 3 here: the packaged MiniLM's
first 3 layers), the documents and the held-out split (`heldout.*`), steps, batch, learning
rate and checkpoint selection (`train.*`, `eval.*`). Arms (`compare.arms`, or `--arms` as a
comma list):

- `simcse`: the student on the training documents' sentences, two dropout views, λ = 0;
- `informin`: the same with InforMin-CL's reconstruction term (λ = `compare.informin_lambda`);
- `infocse_self`: one InfoCSE round, pairs mined by the student itself;
- `infocse_teacher`: one InfoCSE round, pairs mined by the teacher (`annotation.model`,
  default "source": the uncut model);
- `distill`: the student on the same sentences, pulled onto the teacher's vectors (mean
  squared error, no InfoNCE: losses/distillation.py), the obvious peer when shrinking a model.

Every arm starts from the same student, trains `train.max_steps` steps of the same
global batch, and keeps its best *trained* checkpoint by eval.select_by (STS-B dev unless
set; the start is never a candidate). Each is scored on the held-out documents
(same-document retrieval), STS-B dev and STS-B test. Writes `compare.json` and `compare.md`
to the output directory; the start (student) and, with `infocse_teacher`, the teacher (as
that arm scored it) are rows too.
Each arm's difference from the start on STS-B test and on the held-out test documents comes
with its paired-bootstrap 95% interval (``vs_start`` in the JSON, a second table in the
Markdown; evaluation/comparison.py): the test pairs and held-out queries resampled, both
models scored on each resample.
"""

from __future__ import annotations

import copy
import json
import logging
import time
import typing
from dataclasses import field
from pathlib import Path
from typing import Annotated

from pydantic import Field

from distributed_emb.atomic_files import write_text_atomic
from distributed_emb.checks import ConfigError, require_range
from distributed_emb.data.documents import read_documents
from distributed_emb.evaluation.comparison import compare_results
from distributed_emb.evaluation.document_retrieval import same_document_ranks
from distributed_emb.evaluation.paired_bootstrap import PairedDifference
from distributed_emb.evaluation.retrieval import metrics_from_ranks, per_query_from_ranks
from distributed_emb.evaluation.sts import per_pair, read_stsb, spearman_x100, sts_cosines
from distributed_emb.infocse.held_out_documents import HeldOut, split_held_out_documents
from distributed_emb.infocse.round_evaluation import evaluate_dev, round_embedder
from distributed_emb.infocse.rounds import initial_model, round_state, run_rounds, teacher_model
from distributed_emb.infocse.rounds_config import InfoCSEConfig
from distributed_emb.settings import section
from distributed_emb.tables import markdown_table
from distributed_emb.train.driver import run_training
from distributed_emb.train.output_config import OutputConfig

log = logging.getLogger(__name__)

Arm = typing.Literal["infocse_teacher", "simcse", "informin", "infocse_self", "distill"]
ARMS = typing.get_args(Arm)
COLUMNS = (
    ("heldout_recall_at_1", "held R@1"),
    ("heldout_recall_at_5", "held R@5"),
    ("heldout_recall_at_10", "held R@10"),
    ("heldout_mrr", "held MRR"),
    ("stsb_dev", "STS-B dev"),
    ("stsb_test", "STS-B test"),
)
# The columns an arm's difference from the start is given an interval on: key → (group, task,
# metric) of the per-item scores (:func:`scored_test_items`), as evaluation/comparison.py
# names them.
INTERVAL_COLUMNS = {
    "heldout_recall_at_1": ("retrieval", "heldout", "recall@1"),
    "heldout_mrr": ("retrieval", "heldout", "mrr"),
    "stsb_test": ("sts", "STSBenchmark", None),
}
# What the comparison sets on top of the InfoCSE job's defaults (before the user's overrides).
DEFAULTS = ["annotation.model=source", "student.num_layers=3", "rounds.max_rounds=1"]


@section
class ComparisonSettings:
    arms: Annotated[
        list[Arm],
        Field(description="the arms to train and score, in this order (--arms a,b)"),
    ] = field(default_factory=lambda: list(ARMS))
    informin_lambda: Annotated[
        float,
        Field(ge=0, description="λ, the weight of the informin arm's reconstruction term"),
    ] = 0.1


@section
class ComparisonConfig(InfoCSEConfig):
    output: OutputConfig = field(default_factory=lambda: OutputConfig(dir="outputs/compare"))
    compare: ComparisonSettings = field(default_factory=ComparisonSettings)

    def validate(self) -> None:
        """InfoCSE's checks, and at least one arm (the arms' values are declared)."""
        super().validate()
        require_range(len(self.compare.arms), "compare.arms", 1, why="the arms to train")


def format_table(rows: list[dict]) -> str:
    def number(value, digits: int) -> str:
        return f"{value:.{digits}f}" if value is not None else "–"

    columns = ["arm", *(title for _, title in COLUMNS), "steps", "wall s"]
    cells = (
        [row["arm"], *(number(row.get(key), 2) for key, _ in COLUMNS)]
        + [str(row["steps"]) if row.get("steps") is not None else "–", number(row.get("wall_s"), 0)]
        for row in rows
    )
    return markdown_table(columns, cells, right_aligned="-" + "r" * (len(COLUMNS) + 2))


def format_intervals(rows: list[dict]) -> str:
    """Each arm's difference from the start (student), with its paired 95% interval, on the
    test scores: a Markdown table (``*``: the interval excludes 0)."""

    def cell(values: dict | None) -> str:
        if values is None:
            return "–"
        difference = PairedDifference.from_dict(values)
        return difference.format() + (" *" if difference.excludes_zero() else "")

    titles = dict(COLUMNS)
    columns = ["arm − start", *(titles[key] for key in INTERVAL_COLUMNS)]
    cells = (
        [row["arm"], *(cell(row["vs_start"].get(key)) for key in INTERVAL_COLUMNS)]
        for row in rows
        if row.get("vs_start")
    )
    return markdown_table(columns, cells, right_aligned="-" + "r" * len(INTERVAL_COLUMNS))


def format_report(rows: list[dict]) -> str:
    """compare.md: the scores, then each arm against the start with its interval."""
    return (
        f"{format_table(rows)}\n\nDifference from the start (student), paired-bootstrap 95% "
        "interval (test pairs and held-out queries resampled; * excludes 0):\n\n"
        f"{format_intervals(rows)}"
    )


def scored_test_items(model_dir: str, config, heldout: HeldOut | None) -> dict:
    """STS-B test and same-document retrieval on the held-out test documents, per item (each
    pair's cosine, each query's rank), shaped as the evaluation suite's output so that
    evaluation/comparison.py compares two of them. Embedded as round_evaluation.evaluate_dev
    embeds (round_embedder)."""
    training = config.training
    embedder = round_embedder(model_dir, config)
    test = read_stsb("test", training.eval.senteval_dir)
    cosines = sts_cosines(embedder.embed, test)  # (n,)
    items: dict = {
        "model": model_dir,
        "sts": {
            "STSBenchmark": {
                "spearman": spearman_x100(cosines, test.scores),
                "n": len(test),
                "per_pair": per_pair(cosines, test.scores),
            }
        },
        "retrieval": {},
    }
    if heldout is not None and heldout.test is not None:
        task = heldout.test
        ranks = same_document_ranks(embedder.embed(list(task.sentences)), task.doc_index)
        items["retrieval"]["heldout"] = {
            **metrics_from_ranks(ranks, (1, 5, 10)),
            "n_queries": len(task.sentences),
            "per_query": per_query_from_ranks(ranks, (1, 5, 10)),
        }
    return items


def row_scores(items: dict) -> dict:
    """The row's test columns from :func:`scored_test_items`: the numbers the intervals are
    about."""
    scores = {"stsb_test": items["sts"]["STSBenchmark"]["spearman"]}
    held = items["retrieval"].get("heldout")
    if held is not None:
        scores["heldout_mrr"] = held["mrr"]
        for k in (1, 5, 10):
            scores[f"heldout_recall_at_{k}"] = held[f"recall@{k}"]
    return scores


def intervals_from_start(start_items: dict, arm_items: dict) -> dict:
    """{column: PairedDifference.as_dict()} of the arm minus the start (INTERVAL_COLUMNS)."""
    comparison = compare_results(start_items, arm_items)
    intervals = {}
    for key, (group, task, metric) in INTERVAL_COLUMNS.items():
        result = comparison[group].get(task)
        if result is not None:
            intervals[key] = result if metric is None else result[metric]
    return intervals


def _sentences_file(dataset, path: Path) -> int:
    """The training documents' sentences, one a line, for the sentence-level arms."""
    count = 0
    with open(path, "w") as handle:
        for row in dataset.iter_rows():
            for sentence in row["sentences"]:
                sentence = " ".join(str(sentence).split())
                if sentence:
                    handle.write(sentence + "\n")
                    count += 1
    return count


def _sentence_arm(config, student: str, sentences: Path, output: Path, **loss) -> dict:
    """The student trained on the training documents' sentences, with these loss settings."""
    training = copy.deepcopy(config.training)
    training.model.path = student
    training.data.path = str(sentences)
    training.data.kind = "sentences"
    for key, value in loss.items():
        setattr(training.loss, key, value)
    if training.loss.distill_weight > 0:
        training.model.mlp_head = "none"  # the distilled vector is the exported one
    training.eval.start_is_candidate = False
    training.eval.score_start = False  # the start is scored outside this training
    training.output.dir = str(output)
    training.output.run_name = f"compare-{output.name}"
    training.output.resume = "overwrite"
    training.validate()
    result = run_training(training)
    return {"model_dir": result.model_dir, "steps": result.metrics.get("steps")}


def _infocse_arm(config, teacher: str | None, output: Path) -> dict:
    arm = copy.deepcopy(config)
    arm.rounds.stsb_test = False  # scored once, by run_comparison
    arm.annotation.model = teacher
    arm.output.dir = str(output)
    arm.training.output.run_name = f"compare-{output.name}"
    arm.rounds.max_rounds = 1
    records = run_rounds(arm)
    trained = next(r for r in records if r.stage == "infocse")  # the round's trained model
    row = {"model_dir": trained.model_dir, "steps": trained.train_steps, "pairs": trained.pairs}
    if teacher is not None:  # run_rounds scored the teacher on the same sets
        row["teacher"] = json.loads((output / "teacher.json").read_text())
    return row


def run_comparison(config, output: Path, arms: list[str], informin_lambda: float) -> list[dict]:
    output.mkdir(parents=True, exist_ok=True)
    state = round_state(config)
    documents, heldout = split_held_out_documents(
        read_documents(config.documents).dataset, config, output, state
    )
    if heldout is None:
        raise ConfigError("heldout.fraction: the comparison needs held-out documents (> 0)")
    student = initial_model(config, output, state)
    teacher = teacher_model(config) or config.training.model_path
    scoring = copy.deepcopy(config)
    # STS-B test and the held-out test half: scored per item (scored_test_items), once a row.
    scoring.rounds.stsb_test = False
    dev_only = HeldOut(heldout.dev, None)

    def score(model_dir: str) -> tuple[dict, dict]:
        items = scored_test_items(model_dir, scoring, heldout)
        return {**evaluate_dev(model_dir, scoring, dev_only), **row_scores(items)}, items

    start_scores, start_items = score(student)
    rows = [{"arm": "start (student)", **start_scores}]
    sentences = output / "train_sentences.txt"
    log.warning("%d training sentences → %s", _sentences_file(documents, sentences), sentences)
    for arm in arms:
        started = time.perf_counter()
        if arm == "simcse":
            row = _sentence_arm(config, student, sentences, output / arm, reconstruction_weight=0.0)
        elif arm == "informin":
            row = _sentence_arm(
                config, student, sentences, output / arm, reconstruction_weight=informin_lambda
            )
        elif arm == "distill":
            row = _sentence_arm(
                config,
                student,
                sentences,
                output / arm,
                contrastive_weight=0.0,
                reconstruction_weight=0.0,
                mlm_weight=0.0,
                distill_weight=1.0,
                distill_teacher=teacher,
            )
        elif arm == "infocse_self":
            row = _infocse_arm(config, None, output / arm)
        else:
            row = _infocse_arm(config, teacher, output / arm)
        row["wall_s"] = time.perf_counter() - started
        teacher_scores = row.pop("teacher", None)
        if teacher_scores is not None:  # STS-B test not scored there (rounds.stsb_test off)
            rows.append({"arm": "teacher (reference)", **teacher_scores})
        scores, items = score(row["model_dir"])
        row.update(arm=arm, **scores, vs_start=intervals_from_start(start_items, items))
        rows.append(row)
        log.warning("compare %s: %s", arm, json.dumps(row))
        write_text_atomic(output / "compare.json", json.dumps(rows, indent=2))
        write_text_atomic(output / "compare.md", format_report(rows) + "\n")
    return rows
