"""InfoCSE rounds: annotate → train on the mined pairs → evaluate → choose, until the chosen
dev score stops rising; the best round's model is exported.

Round r annotates the documents with round r−1's model (round 1: the initial model), trains
a copy of the same model on the pairs with the core trainer (in-batch and cross-worker
negatives, same-document negatives masked), and scores STS-B dev and an STS-B-dev retrieval
set. InfoCSE++ adds a supervised fine-tuning step on labelled pairs after each round.

Teacher/student: the trained model (the student) is `model.path` or its first
`student.num_layers` layers (infocse/student.py); a teacher (`annotation.model`) annotates
rounds 1..`annotation.teacher_rounds` in the student's place. Held-out documents
(`heldout.*`, split by document) are never annotated or trained on; every round's model is
scored on them by same-document retrieval (evaluation/document_retrieval.py), next to STS-B
dev. `rounds.select_by` names the score that chooses the round and the export: STS-B dev, the
held-out dev MRR, or `eval` (eval.select_by's: STS-B dev, or nDCG@10 on a split of the user's
BEIR directory eval.retrieval_dir, which each round's training also keeps its checkpoint by).

This module is the loop and the start of a run; each step is a module of its own:
round_annotation.py (a round's pairs), round_training.py (its training, InfoCSE++'s step),
round_evaluation.py (the scores and the choice), round_records.py (the records, table and
plot), round_export.py, and held_out_documents.py.

What a run leaves in `output_dir`: `rounds.json` (the rounds, the regime: "given model" or
"student" with its `student_layers`, and what was `exported`) and `rounds.md` (the table),
`rounds.png` (STS-B dev, retrieval and mined pairs per round), `rounds_log.jsonl` and
`tensorboard/` (one row per round: kind `rounds` for the initial model and the InfoCSE rounds,
`supervised` for InfoCSE++ steps, step = round), `run.log` (the round lines), `model/` (the
best round's), and per round `round_<r>/train/` with that training's own `run.log` (its step
and evaluation lines), `train_log.jsonl`, `tensorboard/`, `learning_curves.png` and
`metrics.json`. With `output.storage_path` the rounds' state root (round_state.py) holds all
of it too, written as each round finishes: `logs/run.log` (the driver's lines, also every
LOG_UPLOAD_S), `logs/rounds_log.jsonl`, `logs/tensorboard/`, `rounds.png` and `teacher.json`
beside the state's own files, and the export's card once compared.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from distributed_emb import storage
from distributed_emb.atomic_files import write_text_atomic
from distributed_emb.data.documents import read_documents
from distributed_emb.infocse.held_out_documents import (
    HeldOut,
    require_held_out_to_choose,
    split_held_out_documents,
)
from distributed_emb.infocse.round_annotation import RoundAnnotator, RoundPairs
from distributed_emb.infocse.round_evaluation import (
    evaluate_dev,
    next_round_follows,
    scores_line,
    selection_name,
    selection_score,
    standing,
)
from distributed_emb.infocse.round_export import export_rounds, regime_line
from distributed_emb.infocse.round_records import (
    ROUNDS_LOG,
    RoundRecord,
    log_record,
    record_from_row,
    save_rounds,
    score_fields,
    training_fields,
)
from distributed_emb.infocse.round_state import TEACHER_FILE, RoundState
from distributed_emb.infocse.round_training import (
    base_run_name,
    keep_stage,
    round_training_config,
    supervised_step,
    train_stage,
)
from distributed_emb.infocse.rounds_config import InfoCSEConfig
from distributed_emb.infocse.student import build_layer_student
from distributed_emb.model.sentence_transformer import is_sentence_transformer_dir
from distributed_emb.tracking import LOGS_DIR, MetricsSinks, StoredLogs

log = logging.getLogger(__name__)

# While the rounds run, the driver's lines reach storage this often, and at every round's end.
LOG_UPLOAD_S = 30.0
# The driver's lines on storage are the package's loggers' records. Not the root logger's:
# each round's training keeps its own stored logs there while it runs (train/driver.py), and
# StoredLogs keeps one handler per logger, so it would detach this run's.
_RUN_LOGGER = "distributed_emb"


def run_rounds(config: InfoCSEConfig) -> list[RoundRecord]:
    output = Path(config.output.dir)
    output.mkdir(parents=True, exist_ok=True)
    sinks = MetricsSinks.start(
        config.training.logging, output, asdict(config), base_run_name(config),
        log_name=ROUNDS_LOG, key="logging",
    )  # fmt: skip
    stored = None
    try:
        state = round_state(config)
        earlier = state.finished(config, overwrite=config.training.output.resume == "overwrite")
        # Only once the root is this run's: a refused run writes nothing into another's logs.
        if state.remote:
            stored = StoredLogs(state.location(LOGS_DIR), "driver", logging.getLogger(_RUN_LOGGER))
        with stored.every(LOG_UPLOAD_S) if stored is not None else contextlib.nullcontext():
            return _Run(config, output, state, sinks, stored).rounds(earlier)
    finally:
        sinks.close()
        if stored is not None:
            stored.close()


def round_state(config: InfoCSEConfig) -> RoundState:
    """The rounds' state: on `output.storage_path` (every node reaches it), else in
    the output directory (infocse/round_state.py)."""
    storage_path = config.training.output.storage_path
    if storage_path:
        return RoundState(storage.join(storage_path, base_run_name(config)), remote=True)
    return RoundState(str(Path(config.output.dir).resolve()), remote=False)


@dataclass
class _Run:
    """What the steps of one run share."""

    config: InfoCSEConfig
    output: Path
    state: RoundState
    sinks: MetricsSinks
    stored: StoredLogs | None  # the driver's lines on storage (None: no storage path)
    heldout: HeldOut | None = None

    def rounds(self, earlier: dict | None) -> list[RoundRecord]:
        """The whole run: round 0 (or an earlier attempt's rounds), the rounds, the export."""
        config = self.config
        corpus = read_documents(config.documents)
        documents, self.heldout = split_held_out_documents(
            corpus.dataset, config, self.output, self.state
        )
        require_held_out_to_choose(config, self.heldout)
        teacher = teacher_model(config)
        if config.student.num_layers is not None:
            log.warning(regime_line(config))
        records = self._continued(earlier) if earlier is not None else self._started(teacher)
        annotator = RoundAnnotator(config, documents, teacher, self.state, records)
        best = self._loop(annotator, records)
        exported, yardsticks = export_rounds(
            records, best, self.output, config, self.state, self.heldout
        )
        self._save(records, best, exported, yardsticks)
        return records

    def _loop(self, annotator: RoundAnnotator, records: list[RoundRecord]) -> RoundRecord:
        """annotate → train → evaluate → choose, round after round, until the chosen score
        has not risen for rounds.patience rounds; `records` grows by each round's. Returns the
        chosen record."""
        config = self.config
        best, without_gain = standing(records, config)
        for index in _rounds_left(records, without_gain, config):
            model_dir = records[-1].model_dir
            pairs = annotator.pairs(index, model_dir)  # annotate
            training = round_training_config(
                config, index, model_dir, pairs.annotation.pairs_path, self.output, self.state,
                self.heldout, pairs.continued,
            )  # fmt: skip
            worth_mining = next_round_follows(config, selection_score(best, config), without_gain)
            callbacks = annotator.mine_next_while_training(index, training, worth_mining)
            try:
                result = train_stage(training, callbacks=callbacks)  # train
                scores = evaluate_dev(result.model_dir, config, self.heldout)  # evaluate
            except BaseException:
                annotator.stop_mining()
                raise
            trained = keep_stage(self.state, result, training, index, "train")
            self._add(records, _round_record(index, pairs, result.metrics, scores, trained))
            if config.supervised.enabled:
                self._add(records, supervised_step(
                    config, index, trained, self.state, self.output, self.heldout
                ))  # fmt: skip
            best, without_gain = standing(records, config)  # choose
            if without_gain >= config.rounds.patience:
                log.warning(
                    "%s stopped rising (best %.2f at round %d): stopping",
                    selection_name(config), selection_score(best, config), best.round,
                )  # fmt: skip
                annotator.stop_mining()  # its pairs are not needed: do not wait
                break
            annotator.collect_mined(result.metrics.get("best_step"))
            self._save(records, best)
        return best

    def _started(self, teacher: str | None) -> list[RoundRecord]:
        """Round 0: the initial model scored (and the teacher, for reference)."""
        config = self.config
        initial = initial_model(config, self.output, self.state)
        scores = evaluate_dev(initial, config, self.heldout)
        records: list[RoundRecord] = []
        self._add(records, RoundRecord(0, "initial", initial, **score_fields(scores)))
        # Saved before any round: every round's state under the root is then covered by the
        # settings check of a restart (RoundState.finished).
        self._save(records, records[0])
        if teacher is not None:
            # The teacher's own scores, for reference (never a candidate for export: it is
            # not the model being trained).
            teacher_scores = evaluate_dev(teacher, config, self.heldout)
            log.warning("teacher %s: %s", teacher, scores_line(teacher_scores))
            text = json.dumps({"model": teacher, **teacher_scores}, indent=2)
            write_text_atomic(self.output / TEACHER_FILE, text)
            if self.state.remote:
                storage.write_text(self.state.location(TEACHER_FILE), text)
        return records

    def _continued(self, earlier: dict) -> list[RoundRecord]:
        """The rounds an earlier attempt of this run finished (rounds.json)."""
        records = [record_from_row(row) for row in earlier["rounds"]]
        log.warning(
            "continuing the rounds in %s after round %d", self.state.root, records[-1].round
        )
        for record in records:  # the sinks (started afresh) get the earlier rows again
            log_record(record, self.sinks)
        return records

    def _add(self, records: list[RoundRecord], record: RoundRecord) -> None:
        records.append(record)
        log_record(record, self.sinks)

    def _save(self, records, best, exported: str | None = None, yardsticks=None) -> None:
        save_rounds(records, best, self.output, self.state, self.config, exported, yardsticks)
        if self.stored is not None:
            self.stored.upload()  # the driver's lines up to here, beside the records


def _rounds_left(records: list[RoundRecord], without_gain: int, config: InfoCSEConfig) -> range:
    if without_gain >= config.rounds.patience:
        return range(0)  # the earlier attempt had stopped
    return range(records[-1].round + 1, config.rounds.max_rounds + 1)


def _round_record(
    index: int, pairs: RoundPairs, metrics: dict, scores: dict, model_dir: str
) -> RoundRecord:
    counts = pairs.annotation.counts
    return RoundRecord(
        index,
        "infocse",
        model_dir,
        pairs=counts.pairs,
        documents_with_pairs=counts.documents - counts.documents_without_pairs,
        overlap_with_previous=pairs.overlap_with_previous,
        annotate_s=round(pairs.annotation.wall_seconds, 1),
        annotated_by=pairs.annotated_by,
        mined_at_step=pairs.source.get("mined_at_step"),
        overlapped_annotate_s=pairs.source.get("overlapped_annotate_s"),
        pairs_location=pairs.annotation.pairs_path,
        resumed=pairs.continued,
        **training_fields(metrics),
        **score_fields(scores),
    )


def initial_model(config: InfoCSEConfig, output: Path, state: RoundState) -> str:
    """The model rounds train: model.path, or its first student.num_layers layers
    (built offline into output/student, a deterministic cut; with a storage path, put there
    as `student/` so that annotation actors and Train workers on any node load it)."""
    source = config.training.model_path
    if config.student.num_layers is None:
        return config.training.model.path or source

    target = output / "student"
    if target.exists():
        shutil.rmtree(target)
    pooler = None if is_sentence_transformer_dir(source) else config.training.model.pooler
    built = build_layer_student(source, config.student.num_layers, str(target), pooler=pooler)
    if not state.remote:
        return built
    location = storage.copy_to_storage(built, state.location("student"))
    shutil.rmtree(target)
    return location


def teacher_model(config: InfoCSEConfig) -> str | None:
    """annotation.model: a path, "source" (the model the student was cut from), or None."""
    model = config.annotation.model
    if model == "source":
        return config.training.model_path
    return model
