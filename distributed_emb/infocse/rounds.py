"""InfoCSE rounds: annotate → train on the mined pairs → evaluate → repeat until the dev score
stops rising; keep and export the best round's model.

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

What a run leaves in `output_dir`: `rounds.json` (the rounds, the regime: "given model" or
"student" with its `student_layers`, and what was `exported`) and `rounds.md` (the table),
`rounds.png` (STS-B dev, retrieval and mined pairs per round), `rounds_log.jsonl` and
`tensorboard/` (one row per round: kind `rounds` for the initial model and the InfoCSE rounds,
`supervised` for InfoCSE++ steps, step = round), `run.log` (the round lines), `model/` (the
best round's), and per round `round_<r>/train/` with that training's own `run.log` (its step
and evaluation lines), `train_log.jsonl`, `tensorboard/`, `learning_curves.png` and
`metrics.json`.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from distributed_emb import storage
from distributed_emb.atomic_files import staged_directory, write_text_atomic
from distributed_emb.config import TrainingConfig
from distributed_emb.data.documents import read_documents
from distributed_emb.data.held_out import split_held_out
from distributed_emb.evaluation.beir import evaluate_split, evaluate_splits
from distributed_emb.evaluation.document_retrieval import (
    SameDocumentTask,
    evaluate_same_document,
)
from distributed_emb.evaluation.document_topics import write_held_out_yardstick
from distributed_emb.evaluation.retrieval import evaluate_retrieval, sts_retrieval_task
from distributed_emb.evaluation.senteval_data import read_sick_relatedness, read_sts_benchmark
from distributed_emb.evaluation.sts import read_stsb, sts_spearman, stsb_score
from distributed_emb.evaluation.yardsticks import (
    compare_with_given,
    passage_length,
    warning_lines,
    yardstick_lines,
)
from distributed_emb.infocse.annotate import (
    AnnotationCounts,
    AnnotationResult,
    annotate_documents,
)
from distributed_emb.infocse.overlap import (
    NextRoundAnnotator,
    PairVersion,
    PairVersions,
    follow_training,
)
from distributed_emb.infocse.pairs import pair_overlap_on_cluster
from distributed_emb.infocse.round_state import RoundState
from distributed_emb.infocse.rounds_config import InfoCSEConfig
from distributed_emb.infocse.student import build_layer_student
from distributed_emb.model.embedder import Embedder, EmbeddingLookup
from distributed_emb.model.model_card import PACKAGED_MODEL_ID, add_card_lines
from distributed_emb.model.sentence_transformer import (
    is_sentence_transformer_dir,
    load_sentence_transformer,
)
from distributed_emb.paths import shipped_senteval_dir
from distributed_emb.plots import Panel, write_panels
from distributed_emb.selection import (
    STSB_DEV,
    describe,
    documents_split,
    given_model_round_line,
    is_given_model,
    retrieval_split,
)
from distributed_emb.tracking import MetricsSinks
from distributed_emb.train.driver import export_checkpoint, run_training, yardstick_encoders

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


@dataclass
class HeldOut:
    """Same-document retrieval tasks on the two halves of the held-out documents, and the
    document-level yardstick built from them (a BEIR directory, local or on storage)."""

    dev: SameDocumentTask | None
    test: SameDocumentTask | None
    documents_dir: str | None = None


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


def _with_fixed_length(annotation, initial_model: str):
    """The annotation config with max_seq_length resolved once, from the initial model when
    unset: a round's export carries the *training* max length (e.g. 32), so "the model's own"
    would otherwise silently shorten what later rounds cluster on."""

    if annotation.max_seq_length is not None:
        return annotation
    fixed = copy.deepcopy(annotation)
    fixed.max_seq_length = load_sentence_transformer(
        initial_model, pooler=annotation.pooler, device="cpu"
    ).max_seq_length
    log.info("annotating every round at max_seq_length=%s", fixed.max_seq_length)
    return fixed


def _train(training: TrainingConfig, callbacks: list | None = None):
    """One core-trainer run of a round (its config from :func:`_training_config`)."""
    # The training's step and evaluation lines go to its own run.log (rank 0 writes it).
    log.info("%s: training, step lines in %s", training.output.run_name,
             Path(training.output.dir) / "run.log")  # fmt: skip
    return run_training(training, callbacks=callbacks)


def _training_config(
    config: InfoCSEConfig,
    model_dir: str,
    pairs_path: str,
    output_dir: str,
    stage_name: str,
    overrides: dict | None = None,
    resume: str = "overwrite",
) -> TrainingConfig:
    """The core trainer's config for one round's training on `pairs_path` from `model_dir`."""
    training = copy.deepcopy(config.training)
    training.model.path = model_dir
    training.data.path = pairs_path
    training.data.kind = "pairs"
    training.data.group_column = "doc_id"
    # The pairs are written in an order spread over documents (annotate.spread_keys); the
    # stream permutes files and rows within blocks on top, from the training seed.
    training.data.shuffle_seed = training.train.seed
    training.output.dir = output_dir
    # One Ray Train run per round and stage ("<name>-round_2-train"): with a shared
    # output.storage_path, a round must never find (and resume) another round's checkpoints.
    # A round started afresh deletes what an earlier attempt of it left ("overwrite"); a round
    # whose pairs an earlier attempt committed continues that attempt's training ("auto").
    training.output.run_name = f"{_base_run_name(config)}-{stage_name}"
    training.output.resume = resume
    # The round's model is its training's best trained checkpoint, even when worse than the
    # model it started from: the next round re-annotates with it, and run_rounds decides
    # (patience) and exports the best of all rounds, the initial model included.
    training.eval.start_is_candidate = False
    training.eval.score_start = False  # the start is scored outside this training
    for section_key, value in (overrides or {}).items():
        section, key = section_key.split(".")
        setattr(getattr(training, section), key, value)
    return training


def _documents_dir(heldout: HeldOut | None) -> str | None:
    """The rounds' document-level yardstick: their own held-out documents' (never the shipped
    example, which may hold documents the rounds train on); None without held-out documents."""
    return heldout.documents_dir if heldout is not None else None


def _base_run_name(config: InfoCSEConfig) -> str:
    return config.training.output.run_name or Path(config.output.dir).name


def supervised_pairs_file(config: InfoCSEConfig, location: str) -> int:
    """InfoCSE++ labelled positives: train pairs with gold score ≥ threshold, each its own
    group, written to `location` (a local path or on the storage path: Train workers on any
    node read it)."""

    senteval = config.training.eval.senteval_dir or shipped_senteval_dir()
    s = config.supervised
    data = (
        read_sts_benchmark(senteval, "train")
        if s.source == "stsb"
        else read_sick_relatedness(senteval, "train")
    )
    keep = [i for i, score in enumerate(data.scores) if score >= s.score_threshold]
    table = pa.table(
        {
            "anchor": [data.sentences1[i] for i in keep],
            "positive": [data.sentences2[i] for i in keep],
            "doc_id": [f"{s.source}-{i}" for i in keep],
        }
    )
    with tempfile.TemporaryDirectory() as scratch:
        local = Path(scratch) / "supervised_pairs.parquet"
        pq.write_table(table, local)
        storage.copy_to_storage(local, location)
    return len(keep)


def run_rounds(config: InfoCSEConfig) -> list[RoundRecord]:
    output = Path(config.output.dir)
    output.mkdir(parents=True, exist_ok=True)
    sinks = MetricsSinks.start(
        config.training.logging, output, asdict(config), _base_run_name(config),
        log_name=ROUNDS_LOG, key="logging",
    )  # fmt: skip
    try:
        return _run_rounds(config, output, sinks)
    finally:
        sinks.close()


def round_state(config: InfoCSEConfig) -> RoundState:
    """The rounds' state: on `output.storage_path` (every node reaches it), else in
    the output directory (infocse/round_state.py)."""
    storage_path = config.training.output.storage_path
    if storage_path:
        return RoundState(storage.join(storage_path, _base_run_name(config)), remote=True)
    return RoundState(str(Path(config.output.dir).resolve()), remote=False)


def _run_rounds(config: InfoCSEConfig, output: Path, sinks: MetricsSinks) -> list[RoundRecord]:
    state = round_state(config)
    earlier = state.finished(config, overwrite=config.training.output.resume == "overwrite")
    corpus = read_documents(config.documents)
    documents, heldout = _split_held_out(corpus.dataset, config, output, state)
    if config.rounds.select_by.startswith("heldout_dev") and (
        heldout is None or heldout.dev is None
    ):
        raise ValueError(
            f"rounds.select_by={config.rounds.select_by}: no held-out dev document has 2 "
            f"sentences (heldout.fraction={config.heldout.fraction} of {config.documents.paths}); "
            "raise heldout.fraction or choose rounds by stsb_dev"
        )
    if documents_split(config.training.eval.select_by) and _documents_dir(heldout) is None:
        raise ValueError(
            f"eval.select_by={config.training.eval.select_by}: no held-out document has 2 "
            f"passages (heldout.fraction={config.heldout.fraction} of {config.documents.paths}); "
            "raise heldout.fraction or choose by stsb_dev"
        )
    teacher = _teacher(config)
    if config.student.num_layers is not None:
        log.warning(regime_line(config))
    if earlier is not None:
        records = [_record(row) for row in earlier["rounds"]]
        log.warning("continuing the rounds in %s after round %d", state.root, records[-1].round)
        initial = records[0].model_dir
        for record in records:  # the sinks (started afresh) get the earlier rows again
            _print_row(record, sinks)
    else:
        initial = _initial_model(config, output, state)
        scores = evaluate_dev(initial, config, heldout)
        records = [RoundRecord(0, "initial", initial, **_dev_fields(scores))]
        _print_row(records[-1], sinks)
        # Saved before any round: every round's state under the root is then covered by the
        # settings check of a restart (RoundState.finished).
        _save(records, records[0], output, state, config)
        if teacher is not None:
            # The teacher's own scores, for reference (never a candidate for export: it is
            # not the model being trained).
            teacher_scores = evaluate_dev(teacher, config, heldout)
            log.warning("teacher %s: %s", teacher, _scores_line(teacher_scores))
            _save_json(output / "teacher.json", {"model": teacher, **teacher_scores})
    best, rounds_without_gain = _standing(records, config)
    current_model = records[-1].model_dir
    previous_pairs = next(
        (r.pairs_location for r in reversed(records) if r.stage == "infocse"), None
    )
    annotation_config = _with_fixed_length(config.annotation, initial)
    prepared: PairVersion | None = None  # this round's pairs, mined while the last one trained
    prepared_versions: PairVersions | None = None  # where they were mined
    waited_since = 0.0
    first_round = records[-1].round + 1
    if rounds_without_gain >= config.rounds.patience:
        first_round = config.rounds.max_rounds + 1  # the earlier run had stopped

    for index in range(first_round, config.rounds.max_rounds + 1):
        round_dir = state.round_dir(index)
        by_teacher = teacher is not None and index <= config.annotation.teacher_rounds
        source = state.pairs_source(index)
        continued = source is not None  # an earlier attempt of this run committed its pairs
        if continued:
            annotation = AnnotationResult(
                AnnotationCounts(**source["counts"]), source["annotate_s"], source["pairs"]
            )
            log.warning(
                "round %d: its pairs were committed by an earlier attempt (%s): training "
                "continues from its last checkpoint", index, source["pairs"],
            )  # fmt: skip
        elif prepared is not None:
            annotation, source = _adopt_version(
                prepared, prepared_versions, state, index, waited_since
            )
        else:
            pairs_location = storage.join(round_dir, "pairs")
            storage.delete_tree(pairs_location)  # what an interrupted annotation left
            annotation = annotate_documents(
                documents,
                teacher if by_teacher else current_model,
                pairs_location,
                index,
                annotation_config,
            )
            source = {
                "pairs": pairs_location,
                "counts": asdict(annotation.counts),
                "annotate_s": round(annotation.wall_seconds, 1),
                "mined_at_step": None,
            }
            state.commit_pairs(index, source)
        overlap = None
        if previous_pairs is not None:
            overlap = pair_overlap_on_cluster(previous_pairs, annotation.pairs_path).jaccard
        train_dir = _stage_dir(state, output, index, "train", continued)
        training = _training_config(
            config, current_model, annotation.pairs_path, str(train_dir),
            f"round_{index}-train", {"eval.documents_dir": _documents_dir(heldout)},
            resume="auto" if continued else "overwrite",
        )  # fmt: skip
        follower = None
        if _overlaps(config, index, teacher):
            follower = _follow_training(
                config, documents, annotation_config, index, state, training,
                _next_round_follows(config, _selection_score(best, config), rounds_without_gain),
            )  # fmt: skip
        try:
            result = _train(training, callbacks=[follower.feed] if follower else None)
            scores = evaluate_dev(result.model_dir, config, heldout)
        except BaseException:
            # Stop the mining thread and release its Ray queue: no next round will read it.
            if follower is not None:
                follower.close(timeout_s=0)
            raise
        record = RoundRecord(
            index,
            "infocse",
            _keep_stage(state, result, train_dir, storage.join(round_dir, "train")),
            pairs=annotation.counts.pairs,
            documents_with_pairs=annotation.counts.documents
            - annotation.counts.documents_without_pairs,
            overlap_with_previous=overlap,
            annotate_s=round(annotation.wall_seconds, 1),
            annotated_by="teacher" if by_teacher else "self",
            mined_at_step=source.get("mined_at_step"),
            overlapped_annotate_s=source.get("overlapped_annotate_s"),
            pairs_location=annotation.pairs_path,
            resumed=continued,
            **_training_fields(result.metrics),
            **_dev_fields(scores),
        )
        records.append(record)
        _print_row(record, sinks)
        if config.supervised.enabled:
            record = _supervised_round(config, index, record.model_dir, state, output, heldout)
            records.append(record)
            _print_row(record, sinks)
        current_model, previous_pairs, prepared = record.model_dir, annotation.pairs_path, None
        best, rounds_without_gain = _standing(records, config)
        if rounds_without_gain >= config.rounds.patience:
            log.warning(
                "%s stopped rising (best %.2f at round %d): stopping",
                _selection_name(config),
                _selection_score(best, config),
                best.round,
            )
            if follower is not None:
                follower.close(timeout_s=0)  # its pairs are not needed: do not wait
            break
        if follower is not None:
            # After the round's own evaluation, which the annotation overlapped too.
            waited_since = time.perf_counter()
            prepared = follower.finish(result.metrics.get("best_step"))
            prepared_versions = follower.versions
        _save(records, best, output, state, config)

    exported = exported_line(records, config)
    _export_best(best, output, config, state, exported)
    yardsticks = _compare_export(config, output / "model", heldout)
    _save(records, best, output, state, config, exported, yardsticks)
    return records


def _compare_export(config: InfoCSEConfig, exported_dir: Path, heldout: HeldOut | None) -> dict:
    """Both yardsticks of the export against the given model (model.path), on test splits
    with paired intervals (evaluation/yardsticks.py): logged one line each, with the warning
    line when topic fell, and put on the export's card."""
    training = copy.deepcopy(config.training)
    training.eval.documents_dir = _documents_dir(heldout)
    compared = compare_with_given(
        training.model_path, str(exported_dir), training.eval, yardstick_encoders(training)
    )
    lines = [*yardstick_lines(compared), *warning_lines(compared)]
    for line in lines:
        log.warning("%s", line)
    if lines:
        add_card_lines(exported_dir, lines)
    return compared


def _record(row: dict) -> RoundRecord:
    known = {f.name for f in fields(RoundRecord)}
    return RoundRecord(**{k: v for k, v in row.items() if k in known})


def _selection_field(config: InfoCSEConfig) -> str:
    """The RoundRecord field rounds are chosen and stopped on: rounds.select_by's, where
    "eval" is eval.select_by's (STS-B dev, or the eval.retrieval_dir split's nDCG@10)."""
    if config.rounds.select_by != "eval":
        return config.rounds.select_by
    if documents_split(config.training.eval.select_by) is not None:
        return "documents_dev_ndcg_at_10"
    if retrieval_split(config.training.eval.select_by) is None:
        return STSB_DEV
    return "eval_retrieval_ndcg_at_10"


def _selection_name(config: InfoCSEConfig) -> str:
    """What chooses, in words for log lines: "STS-B dev Spearman", "nDCG@10 on retrieval
    dev", "same-document MRR on the held-out dev documents"."""
    select_by = config.rounds.select_by
    if select_by == "heldout_dev_mrr":
        return "same-document MRR on the held-out dev documents"
    return describe(config.training.eval.select_by if select_by == "eval" else select_by)


def _selection_score(record: RoundRecord, config: InfoCSEConfig) -> float:
    """The dev score rounds are chosen and stopped on (rounds.select_by)."""
    return getattr(record, _selection_field(config))


def _standing(records: list[RoundRecord], config: InfoCSEConfig) -> tuple[RoundRecord, int]:
    """(the best record so far, rounds since it without a new best) under the stopping rule:
    each round is judged by its last record (its supervised step, with InfoCSE++)."""
    best, without_gain = records[0], 0
    last_of_round = {r.round: r for r in records[1:]}
    for record in (last_of_round[i] for i in sorted(last_of_round)):
        score, best_score = _selection_score(record, config), _selection_score(best, config)
        if score > best_score + config.rounds.min_improvement:
            best, without_gain = record, 0
        else:
            without_gain += 1
    return best, without_gain


def _stage_dir(
    state: RoundState, output: Path, index: int, stage: str, continued: bool = False
) -> Path:
    """Where a round's training writes on the driver: inside the output directory on one
    machine; with a storage path, a scratch directory that _keep_stage empties onto it. A
    continued round's earlier results there are dropped: its training writes them again."""
    if state.remote:
        return Path(tempfile.mkdtemp(prefix=f"round_{index}-{stage}-"))
    directory = output / f"round_{index}" / stage
    if continued:
        shutil.rmtree(directory / "model", ignore_errors=True)
        (directory / "metrics.json").unlink(missing_ok=True)
    return directory


def _keep_stage(state: RoundState, result, train_dir: Path, logs_location: str) -> str:
    """The stage's model location for the next round. With a storage path: the model the
    training put beside its checkpoints there, its logs copied to `logs_location`, and the
    driver's scratch copy removed."""
    if not state.remote:
        return result.model_dir
    shutil.rmtree(train_dir / "model", ignore_errors=True)
    storage.copy_to_storage(train_dir, logs_location)
    shutil.rmtree(train_dir, ignore_errors=True)
    return result.metrics["model_uri"]


def _overlaps(config: InfoCSEConfig, index: int, teacher: str | None) -> bool:
    """Does round `index` mine the next round's pairs while it trains (rounds.overlap)? Only
    when a next round exists and is annotated by the model being trained."""
    next_by_teacher = teacher is not None and index + 1 <= config.annotation.teacher_rounds
    return config.rounds.overlap and index < config.rounds.max_rounds and not next_by_teacher


def _follow_training(
    config: InfoCSEConfig,
    documents,
    annotation_config,
    index: int,
    state: RoundState,
    training: TrainingConfig,
    worth_mining,
) -> NextRoundAnnotator:
    """Start mining round index+1's pairs with round `index`'s best checkpoint so far, as its
    training registers checkpoints (infocse/overlap.py), into
    `round_<index>/next_round_pairs` of the rounds' state."""

    def mine(report, directory: str):
        model_location = storage.join(directory, "model")
        # The checkpoint is copied into a directory of this thread's own: `as_directory` of a
        # checkpoint on object storage shares one temp directory per checkpoint in the
        # process, and the training's driver reads the same checkpoint at the same time (the
        # one it ends on), so one side deleted it under the other.
        with tempfile.TemporaryDirectory() as scratch:
            checkpoint_dir = report.checkpoint.to_directory(f"{scratch}/checkpoint")
            if state.remote:  # exported here, then put where the actors' nodes reach it
                local = export_checkpoint(training, checkpoint_dir, f"{scratch}/model")
                storage.copy_to_storage(local, model_location)
            else:
                export_checkpoint(training, checkpoint_dir, model_location)
        pairs_location = storage.join(directory, "pairs")
        result = annotate_documents(
            documents, model_location, pairs_location, index + 1, annotation_config,
            reserve_cpus=False,
        )  # fmt: skip
        return pairs_location, result.counts

    versions = PairVersions(storage.join(state.round_dir(index), "next_round_pairs"))
    return follow_training(versions, mine, worth_mining)


def _next_round_follows(config: InfoCSEConfig, best_dev: float, rounds_without_gain: int):
    """Would a next round run if this round's model were the checkpoint reported? The
    stopping rule of run_rounds applied to the in-training selection score (eval.select_by),
    which is the round's own score when the rounds choose on that same score: the whole
    retrieval split of rounds.select_by=eval, or STS-B dev with eval.max_pairs unset;
    otherwise (held-out retrieval, a subset of STS-B dev, or rounds and training choosing on
    different scores) it is not comparable, and every report is worth mining."""
    r, e = config.rounds, config.training.eval
    field = _selection_field(config)
    comparable = (field == STSB_DEV and e.select_by == STSB_DEV and e.max_pairs is None) or (
        field == "eval_retrieval_ndcg_at_10"
    )
    if not comparable or rounds_without_gain + 1 < r.patience:
        return lambda report: True
    return lambda report: report.score > best_dev + r.min_improvement


def _adopt_version(
    version: PairVersion,
    versions: PairVersions,
    state: RoundState,
    index: int,
    waited_since: float,
) -> tuple[AnnotationResult, dict]:
    """Round `index` trains on `version`'s pairs where they are (nothing is moved: on object
    storage a move is a copy); the other versions and the mining models are deleted, and the
    choice is committed as the round's pairs."""
    versions.discard_except(version.step)
    waited = time.perf_counter() - waited_since
    source = {
        "pairs": version.pairs_dir,
        "counts": asdict(version.counts),
        "annotate_s": round(waited, 1),
        "mined_at_step": version.step,
        "score": version.score,
        "overlapped_annotate_s": version.annotate_s,
    }
    state.commit_pairs(index, source)
    log.warning(
        "pairs mined while the previous round trained, with its step %d (%.0f s of annotation, "
        "%.0f s waited for after it)", version.step, version.annotate_s, waited,
    )  # fmt: skip
    return AnnotationResult(version.counts, waited, version.pairs_dir), source


def _supervised_round(
    config: InfoCSEConfig,
    index: int,
    model_dir: str,
    state: RoundState,
    output: Path,
    heldout: HeldOut | None,
):
    round_dir = state.round_dir(index)
    pairs_file = storage.join(round_dir, "supervised_pairs.parquet")
    count = supervised_pairs_file(config, pairs_file)
    s = config.supervised
    train_dir = _stage_dir(state, output, index, "supervised")
    result = _train(
        _training_config(
            config,
            model_dir,
            pairs_file,
            str(train_dir),
            f"round_{index}-supervised",
            {
                "train.max_steps": s.max_steps,
                "train.learning_rate": s.learning_rate,
                "eval.documents_dir": _documents_dir(heldout),
            },
        )
    )
    scores = evaluate_dev(result.model_dir, config, heldout)
    return RoundRecord(
        index,
        "supervised",
        _keep_stage(state, result, train_dir, storage.join(round_dir, "supervised")),
        pairs=count,
        **_training_fields(result.metrics),
        **_dev_fields(scores),
    )


def _training_fields(metrics: dict) -> dict:
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


def _dev_fields(scores: dict) -> dict:
    return {k: scores[k] for k in _SCORE_FIELDS if k in scores}


def _scores_line(scores: dict) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in scores.items() if v is not None)


def _save_json(path: Path, data: dict) -> None:
    write_text_atomic(path, json.dumps(data, indent=2))


def _initial_model(config: InfoCSEConfig, output: Path, state: RoundState) -> str:
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


def _teacher(config: InfoCSEConfig) -> str | None:
    """annotation.model: a path, "source" (the model the student was cut from), or None."""
    model = config.annotation.model
    if model == "source":
        return config.training.model_path
    return model


def _split_held_out(dataset, config: InfoCSEConfig, output: Path, state: RoundState):
    """(the documents to annotate and train on, HeldOut or None).

    The split is by document (a hash of doc_id, evaluation/document_retrieval.py), decided
    row by row in Ray Data tasks; held-out documents never reach annotation or training. Only
    the held-out documents come to the driver, which scores them: the dev half chooses rounds
    (rounds.select_by=heldout_dev_mrr), the test half is reported."""
    h = config.heldout
    if h.fraction == 0:
        return dataset, None
    training, held = split_held_out(dataset, h)
    tasks, held_rows = {}, []
    for split, split_rows in held.items():
        held_rows += split_rows
        try:
            tasks[split] = SameDocumentTask.from_documents(
                split_rows, h.max_sentences_per_document, f"heldout-{split}"
            )
        except ValueError:
            log.warning("heldout: no %s document has 2 sentences; no %s retrieval", split, split)
            tasks[split] = None
    documents_dir = _write_document_yardstick(held_rows, config, output, state)
    if tasks["dev"] is None and tasks["test"] is None and documents_dir is None:
        return training, None
    log.warning(
        "heldout: documents held out of training, scored by same-document retrieval: dev %s, "
        "test %s", *(_task_size(tasks[split]) for split in ("dev", "test")),
    )  # fmt: skip
    return training, HeldOut(tasks["dev"], tasks["test"], documents_dir)


DOCUMENTS_EVAL_DIR = "documents_eval"


def _write_document_yardstick(
    held_rows: list[dict], config: InfoCSEConfig, output: Path, state: RoundState
) -> str | None:
    """The document-level yardstick (evaluation/document_topics.py) built from the held-out
    documents into `output`/documents_eval (and the state's, on a storage path, where Train
    workers on any node read it); None, logged, when no held-out document has 2 passages."""
    local = write_held_out_yardstick(
        held_rows, config.heldout, config.documents.paths, output / DOCUMENTS_EVAL_DIR
    )
    if local is None or not state.remote:
        return local
    location = state.location(DOCUMENTS_EVAL_DIR)
    storage.delete_tree(location)
    return storage.copy_to_storage(local, location)


def _task_size(task: SameDocumentTask | None) -> str:
    if task is None:
        return "none"
    return f"{task.num_documents} documents ({len(task.sentences)} queries)"


def _export_best(
    best: RoundRecord,
    output: Path,
    config: InfoCSEConfig,
    state: RoundState,
    exported: str | None = None,
) -> None:
    """The best round's model into `output`/model (and the state's model/ on a storage
    path), its card told the regime (a student) and, when it is the given model unchanged,
    `exported` (exported_line)."""
    target = output / "model"
    model_dir = storage.local_model_dir(best.model_dir)
    # Built beside model/ and swapped in: a crash mid-copy keeps the previous model/ whole
    # (it used to be deleted first, leaving nothing, or half a copy).
    with staged_directory(target) as staged:
        if best.stage == "initial" and not is_sentence_transformer_dir(model_dir):
            load_sentence_transformer(
                model_dir,
                pooler=config.training.model.pooler,
                max_seq_length=config.training.model.max_seq_length,
            ).save(str(staged))
        else:
            # dirs_exist_ok: the staging directory already exists (empty).
            shutil.copytree(model_dir, staged, dirs_exist_ok=True)
        notes = [regime_line(config, for_card=True)] if config.student.num_layers else []
        if is_given_model(exported):
            notes.append(exported)
        if notes:
            add_card_lines(staged, notes)
    if state.remote:
        storage.delete_tree(state.location("model"))
        storage.copy_to_storage(target, state.location("model"))
    where = f"{target} and {state.location('model')}" if state.remote else str(target)
    if is_given_model(exported):
        log.warning("%s → %s", exported, where)
        return
    log.warning(
        "best: round %d (%s), %s %.2f → exported to %s",
        best.round,
        best.stage,
        _selection_name(config),
        _selection_score(best, config),
        where,
    )


def exported_line(records: list[RoundRecord], config: InfoCSEConfig) -> str:
    """What the rounds export, for rounds.json's "exported" and the job's last lines: "round
    <r> (<stage>)", or, when no round beat round 0 and round 0 is model.path itself (no
    student), the one line that says the given model is handed back unchanged."""
    best, _ = _standing(records, config)
    if best.stage != "initial" or config.student.num_layers is not None:
        return f"round {best.round} ({best.stage})"
    last_of_round = {r.round: r for r in records[1:]}  # a round is judged by its last record
    top = max(last_of_round.values(), key=lambda r: _selection_score(r, config), default=None)
    return given_model_round_line(
        _selection_name(config),
        top.round if top is not None else None,
        _selection_score(top, config) if top is not None else None,
        _selection_score(best, config),
        config.rounds.min_improvement,
    )


def regime_line(config: InfoCSEConfig, for_card: bool = False) -> str:
    """The student regime in one line (student.num_layers set): the console at the start of
    the rounds, and the export's card (`for_card`: the model's name, no local path)."""
    source = config.training.model.path
    name = PACKAGED_MODEL_ID if source is None else source
    if for_card and source is not None and Path(source).exists():
        name = Path(source).name
    total = _layer_count(config.training.model_path)
    layers = config.student.num_layers
    cut = f"the first {layers} of {total} layers" if total else f"the first {layers} layers"
    return f"regime: student — {cut} of {name}; the export is the student, not the given model"


def _layer_count(model_dir: str) -> int | None:
    """The transformer layers of a local model (its config.json); None when it does not say."""
    config_file = Path(model_dir) / "config.json"
    if not config_file.is_file():
        return None
    return json.loads(config_file.read_text()).get("num_hidden_layers")


def _summary(config: InfoCSEConfig, exported: str | None = None) -> dict:
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


def _print_row(record: RoundRecord, sinks: MetricsSinks) -> None:
    log.warning("InfoCSE %s", format_row(record))
    kind = "supervised" if record.stage == "supervised" else "rounds"
    numbers = {k: v for k, v in asdict(record).items() if k not in ("round", "stage")}
    sinks.log(record.round, numbers, kind)


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


def _save(
    records: list[RoundRecord],
    best: RoundRecord,
    output: Path,
    state: RoundState,
    config: InfoCSEConfig,
    exported: str | None = None,
    yardsticks: dict | None = None,
) -> None:
    """rounds.json/.md in the rounds' state (what a restart reads); with a storage path, a
    copy of both in the output directory beside the logs; the plot there. `exported`: what
    the finished rounds exported (exported_line); `yardsticks`: the export against the given
    model (_compare_export)."""
    table = format_table(records)
    summary = _summary(config, exported)
    if yardsticks:
        summary["yardsticks"] = yardsticks
    state.save(config, records, best, table, summary)
    if state.remote:
        payload = {"rounds": [asdict(r) for r in records], "best": asdict(best), **summary}
        write_text_atomic(output / "rounds.json", json.dumps(payload, indent=2))
        write_text_atomic(output / "rounds.md", table + "\n")
    write_panels(rounds_panels(records), output / PLOT_FILE, title="InfoCSE rounds")
