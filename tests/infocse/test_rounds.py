"""A 2-round InfoCSE run on a tiny BERT through Ray: annotate → train → evaluate → export."""

import json
from pathlib import Path

import numpy as np
import pytest

from distributed_emb.config import ConfigError, load_config
from distributed_emb.infocse.config import InfoCSEConfig
from distributed_emb.infocse.rounds import RoundRecord, _print_row, _save
from distributed_emb.tracking import MetricsSinks, read_train_log, write_panels


def _config(tmp_path, tiny_bert_path, shared_data_dir, extra=()):
    lines = (shared_data_dir / "corpus" / "lee_documents.jsonl").read_text().splitlines()[:24]
    documents = tmp_path / "docs.jsonl"
    documents.write_text("\n".join(lines))
    return load_config(
        InfoCSEConfig,
        "jobs/configs/infocse_default.yaml",
        [
            f"documents.paths=[{documents}]",
            "annotation.pooler=mean",
            "annotation.max_seq_length=32",
            f"training.model.path={tiny_bert_path}",
            "training.train.batch_size=8",
            "training.train.max_steps=2",
            "training.train.learning_rate=1.0e-4",
            "training.eval.eval_steps=2",
            "training.eval.max_pairs=64",
            "rounds.max_rounds=2",
            "rounds.patience=2",
            f"output_dir={tmp_path / 'out'}",
            *extra,
        ],
    )


# Two finished runs serve every end-to-end assertion below (each run is a minute on 2 cores):
# - `self_annotated`: two self-annotated rounds with rounds.overlap (round 2's pairs mined while
#   round 1 trains), every document trained on;
# - `teacher_annotated`: a 1-layer student, a teacher for round 1, a quarter of the documents
#   held out, and rounds.arrange_pairs=false (training streams the annotation shards).


def _finished_run(tmp_path_factory, tiny_bert_path, shared_data_dir, name, extra, teacher=False):
    from conftest import build_tiny_bert
    from harness.local_ray import start_shared_ray

    from distributed_emb.infocse.rounds import run_rounds

    start_shared_ray()
    tmp_path = tmp_path_factory.mktemp(name)
    if teacher:
        extra = [*extra, f"annotation.model={build_tiny_bert(tmp_path / 'teacher', seed=1)}"]
    config = _config(tmp_path, tiny_bert_path, shared_data_dir, extra)
    return config, run_rounds(config), tmp_path / "out"


@pytest.fixture(scope="module")
def self_annotated(tmp_path_factory, tiny_bert_path, shared_data_dir):
    return _finished_run(
        tmp_path_factory, tiny_bert_path, shared_data_dir, "self_annotated",
        ["rounds.overlap=true", "heldout.fraction=0"],
    )  # fmt: skip


@pytest.fixture(scope="module")
def teacher_annotated(tmp_path_factory, tiny_bert_path, shared_data_dir):
    return _finished_run(
        tmp_path_factory, tiny_bert_path, shared_data_dir, "teacher_annotated",
        ["student.num_layers=1", "heldout.fraction=0.25", "heldout.seed=1",
         "rounds.arrange_pairs=false"],
        teacher=True,
    )  # fmt: skip


def test_config_errors_name_the_section_key(tmp_path, tiny_bert_path, shared_data_dir):
    with pytest.raises(ConfigError, match=r"rounds\.max_rounds"):
        _config(tmp_path, tiny_bert_path, shared_data_dir, ["rounds.max_rounds=0"])
    with pytest.raises(ConfigError, match=r"training\.loss\.temperature"):
        _config(tmp_path, tiny_bert_path, shared_data_dir, ["training.loss.temperature=0"])
    with pytest.raises(ConfigError, match="documents.paths"):
        _config(tmp_path, tiny_bert_path, shared_data_dir, ["documents.paths=[/no/such.jsonl]"])


@pytest.mark.slow
@pytest.mark.ray
def test_two_rounds_annotate_train_and_export_the_best(ray_local, self_annotated):
    from sentence_transformers import SentenceTransformer

    _, records, out = self_annotated

    stages = [(r.round, r.stage) for r in records]
    assert stages == [(0, "initial"), (1, "infocse"), (2, "infocse")]
    assert all(r.pairs > 0 and r.train_steps == 2 for r in records[1:])
    # A round keeps a trained checkpoint, never its starting model (run_rounds compares rounds).
    assert all(r.kept_step == 2 and r.last_step_dev is not None for r in records[1:])
    assert records[2].overlap_with_previous is not None
    assert 0.0 <= records[2].overlap_with_previous <= 1.0
    # Round 2 annotated with round 1's model: its input model is round 1's export.
    saved = json.loads((out / "rounds.json").read_text())
    best = max(records, key=lambda r: r.stsb_dev)
    assert saved["best"]["round"] == best.round
    # The exported model is the best round's model.
    sentences = ["A man is playing a guitar.", "The stock market fell."]
    exported = SentenceTransformer(str(out / "model"), device="cpu").encode(sentences)
    if best.stage != "initial":
        reference = SentenceTransformer(best.model_dir, device="cpu").encode(sentences)
        np.testing.assert_allclose(exported, reference, rtol=1e-6, atol=1e-6)
    assert (out / "rounds.md").read_text().startswith("round")
    assert Path(records[1].model_dir).is_dir()
    # One row per round in the rounds' sinks; each round's training has its own run.log with
    # its step and evaluation lines.
    logged = read_train_log(out / "rounds_log.jsonl")
    assert [(r["kind"], r["step"]) for r in logged] == [("rounds", 0), ("rounds", 1), ("rounds", 2)]
    assert [r["stsb_dev"] for r in logged] == [pytest.approx(r.stsb_dev) for r in records]
    assert (out / "rounds.png").read_bytes()[:4] == b"\x89PNG"
    round_log = (out / "round_1" / "train" / "run.log").read_text()
    assert "step 2/2 STS-B dev Spearman" in round_log
    # A round's start is the previous round's model, scored by the rounds already: its
    # training does not score it again (eval.score_start=false), it evaluates trained steps only.
    train_metrics = json.loads((out / "round_1" / "train" / "metrics.json").read_text())
    assert [row["step"] for row in train_metrics["history"]] == [2]
    assert train_metrics["stsb_dev_before"] is None
    assert "step 0/2 STS-B dev" not in round_log


def test_every_round_annotates_at_the_initial_models_length(tmp_path, tiny_bert_path):
    from distributed_emb.infocse.annotate import AnnotationConfig
    from distributed_emb.infocse.rounds import _with_fixed_length
    from distributed_emb.model.sentence_transformer import load_sentence_transformer

    initial = tmp_path / "initial"
    load_sentence_transformer(tiny_bert_path, pooler="mean", max_seq_length=48).save(str(initial))
    resolved = _with_fixed_length(AnnotationConfig(), str(initial))
    assert resolved.max_seq_length == 48  # not a later round's export's training length
    assert (
        _with_fixed_length(AnnotationConfig(max_seq_length=20), str(initial)).max_seq_length == 20
    )


@pytest.mark.slow
@pytest.mark.ray
def test_a_round_can_stream_its_pairs_straight_from_the_annotation_shards(
    ray_local, teacher_annotated
):
    """rounds.arrange_pairs=false: no driver pass over the pairs; training reads the Parquet
    shards the annotation actors wrote."""
    import pyarrow.parquet as pq

    _, records, out = teacher_annotated
    shards = sorted((out / "round_1" / "pairs").glob("*.parquet"))
    assert shards and not (out / "round_1" / "pairs_arranged.parquet").exists()
    mined = sum(pq.ParquetFile(shard).metadata.num_rows for shard in shards)
    assert records[1].pairs == mined and records[1].train_steps == 2
    metrics = json.loads((out / "round_1" / "train" / "metrics.json").read_text())
    assert 0 < metrics["corpus"]["kept"] <= mined  # rows streamed from the shards


def test_every_round_is_plotted_and_logged_to_the_sinks(tmp_path, monkeypatch):
    """rounds.png holds STS-B dev, retrieval and mined pairs per round (InfoCSE++ steps as
    their own lines); rounds_log.jsonl and TensorBoard one row per round."""
    from distributed_emb.config import LoggingConfig
    from distributed_emb.infocse import rounds

    records = [
        RoundRecord(0, "initial", "m0", stsb_dev=70.0, retrieval_mrr=0.5,
                    retrieval_recall_at_1=0.4),
        RoundRecord(1, "infocse", "m1", pairs=120, stsb_dev=72.5, retrieval_mrr=0.55,
                    retrieval_recall_at_1=0.45, train_steps=10, kept_step=10),
        RoundRecord(1, "supervised", "m1s", pairs=30, stsb_dev=75.0, retrieval_mrr=0.6,
                    retrieval_recall_at_1=0.5),
        RoundRecord(2, "infocse", "m2", pairs=90, overlap_with_previous=0.25, stsb_dev=71.0,
                    retrieval_mrr=0.52, retrieval_recall_at_1=0.41),
    ]  # fmt: skip
    plotted = []

    def record_plot(panels, path, title=None):
        plotted.append(panels)
        return write_panels(panels, path, title)

    monkeypatch.setattr(rounds, "write_panels", record_plot)
    sinks = MetricsSinks.start(LoggingConfig(), tmp_path, {}, "test", log_name="rounds_log.jsonl")
    for record in records:
        _print_row(record, sinks)
    sinks.close()
    _save(records, records[2], tmp_path)

    (panels,) = plotted
    dev, retrieval, pairs = panels
    assert dev.series == {
        "InfoCSE": [(0, 70.0), (1, 72.5), (2, 71.0)],
        "InfoCSE++ (supervised)": [(1, 75.0)],
    }
    assert retrieval.series["MRR"] == [(0, 0.5), (1, 0.55), (2, 0.52)]
    assert retrieval.series["R@1, supervised"] == [(1, 0.5)]
    assert pairs.series == {"pairs": [(1, 120), (2, 90)]} and dev.xticks == [0, 1, 2]
    assert (tmp_path / "rounds.png").read_bytes()[:4] == b"\x89PNG"

    logged = read_train_log(tmp_path / "rounds_log.jsonl")
    assert [(r["kind"], r["step"], r["stsb_dev"]) for r in logged] == [
        ("rounds", 0, 70.0), ("rounds", 1, 72.5), ("supervised", 1, 75.0), ("rounds", 2, 71.0)
    ]  # fmt: skip
    assert logged[3]["overlap_with_previous"] == 0.25 and "overlap_with_previous" not in logged[0]
    accumulator_module = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator"
    )
    accumulator = accumulator_module.EventAccumulator(str(tmp_path / "tensorboard"))
    accumulator.Reload()
    assert [e.value for e in accumulator.Scalars("rounds/stsb_dev")] == [70.0, 72.5, 71.0]


def test_student_and_teacher_resolve_from_the_config(tmp_path, tiny_bert_path, shared_data_dir):
    from transformers import AutoConfig

    from distributed_emb.infocse.rounds import _initial_model, _teacher

    config = _config(tmp_path, tiny_bert_path, shared_data_dir)
    assert _initial_model(config, tmp_path) == tiny_bert_path  # no student: the model itself
    assert _teacher(config) is None  # no teacher: every round self-annotated
    config = _config(
        tmp_path, tiny_bert_path, shared_data_dir,
        ["student.num_layers=1", "annotation.model=source"],
    )  # fmt: skip
    student = _initial_model(config, tmp_path)
    assert student == str(tmp_path / "student")
    assert AutoConfig.from_pretrained(student).num_hidden_layers == 1
    assert _teacher(config) == tiny_bert_path  # "source": the uncut model
    with pytest.raises(ConfigError, match=r"heldout\.fraction"):
        _config(tmp_path, tiny_bert_path, shared_data_dir, ["heldout.fraction=1.0"])
    with pytest.raises(ConfigError, match=r"student\.num_layers"):
        _config(tmp_path, tiny_bert_path, shared_data_dir, ["student.num_layers=0"])


def test_held_out_retrieval_is_a_row_column_and_a_panel(tmp_path):
    from distributed_emb.infocse.rounds import format_table, rounds_panels

    records = [
        RoundRecord(0, "initial", "m0", stsb_dev=70.0, retrieval_mrr=50.0,
                    retrieval_recall_at_1=40.0, heldout_mrr=30.0, heldout_recall_at_1=20.0,
                    heldout_recall_at_5=35.0, heldout_recall_at_10=45.0),
        RoundRecord(1, "infocse", "m1", pairs=10, stsb_dev=71.0, retrieval_mrr=51.0,
                    retrieval_recall_at_1=41.0, heldout_mrr=33.0, heldout_recall_at_1=22.5,
                    heldout_recall_at_5=36.0, heldout_recall_at_10=47.0, annotated_by="teacher",
                    stsb_test=65.5),
    ]  # fmt: skip
    table = format_table(records).splitlines()
    assert "held R@1" in table[0] and "STS-B test" in table[0]
    assert "teacher" in table[2] and "22.50" in table[2] and "65.50" in table[2]
    held = rounds_panels(records)[-1]
    assert held.series["R@1"] == [(0, 20.0), (1, 22.5)]
    assert held.series["MRR"] == [(0, 30.0), (1, 33.0)]


@pytest.mark.slow
@pytest.mark.ray
def test_teacher_annotates_round_one_the_student_the_rest_held_out_documents_unseen(
    ray_local, teacher_annotated
):
    """A 1-layer student of the tiny BERT; a different tiny BERT as teacher for round 1.
    Round 1's pairs are exactly the teacher's (single-process reference) on the training
    documents; no pair comes from a held-out document; round 2 is self-annotated."""
    from distributed_emb.evaluation.document_retrieval import held_out_doc_ids
    from distributed_emb.infocse.annotate import AnnotationConfig, annotate_documents_locally
    from distributed_emb.infocse.pairs import read_pairs

    config, records, out = teacher_annotated
    teacher = config.annotation.model
    assert [(r.round, r.annotated_by) for r in records] == [(0, None), (1, "teacher"), (2, "self")]
    assert all(r.heldout_mrr is not None and 0 < r.heldout_recall_at_10 <= 100 for r in records)

    documents = [
        json.loads(line) for line in Path(config.documents.paths[0]).read_text().splitlines()
    ]
    held = held_out_doc_ids([d["id"] for d in documents], 0.25, seed=1)
    assert 0 < len(held) < len(documents)
    training = [{"doc_id": d["id"], "sentences": d["sentences"]} for d in documents
                if d["id"] not in held]  # fmt: skip
    annotation = AnnotationConfig(pooler="mean", max_seq_length=32)
    expected, _ = annotate_documents_locally(training, teacher, round_index=1, config=annotation)

    def key(rows):
        return sorted((r["doc_id"], r["anchor"], r["positive"]) for r in rows)

    round_1 = read_pairs(str(out / "round_1" / "pairs"))
    assert key(round_1) == key(expected)
    round_2 = read_pairs(str(out / "round_2" / "pairs"))
    assert not {r["doc_id"] for r in round_1 + round_2} & held


@pytest.mark.slow
@pytest.mark.ray
def test_overlapped_annotation_mines_the_next_rounds_pairs_with_the_kept_checkpoint(
    ray_local, self_annotated
):
    """rounds.overlap=true under Ray Train: round 1's registered checkpoint reaches the driver
    through the Train controller's callback, round 2's pairs are mined with it while round 1
    finishes, and they are exactly the pairs round 1's model mines after training (a
    single-process reference), as sequential rounds would have them."""
    from distributed_emb.data.documents import read_documents_locally
    from distributed_emb.infocse.annotate import AnnotationConfig, annotate_documents_locally
    from distributed_emb.infocse.pairs import read_pairs

    # One trained evaluation per round (step 2 of 2): the kept step is the one mined.
    config, records, out = self_annotated
    assert [(r.round, r.mined_at_step) for r in records] == [(0, None), (1, None), (2, 2)]
    assert records[1].kept_step == 2
    assert records[2].overlapped_annotate_s > 0 and records[2].pairs > 0
    assert not (out / "round_1" / "next_round_pairs").exists()  # the versions were cleared
    source = json.loads((out / "round_2" / "pairs_source.json").read_text())
    assert source["mined_at_step"] == 2

    training, _ = read_documents_locally(config.documents, log=False)  # what round 2 annotated
    annotation = AnnotationConfig(pooler="mean", max_seq_length=32)
    expected, reference = annotate_documents_locally(
        training, records[1].model_dir, round_index=2, config=annotation
    )

    def key(rows):
        return sorted((r["doc_id"], r["anchor"], r["positive"], r["round"]) for r in rows)

    assert key(read_pairs(str(out / "round_2" / "pairs"))) == key(expected)
    assert records[2].pairs == reference.counts.pairs
    table = (out / "rounds.md").read_text().splitlines()
    assert "mined at" in table[0] and table[3].split()[-1] == "2"


def test_overlap_mines_only_for_a_round_the_stopping_rule_would_run(
    tmp_path, tiny_bert_path, shared_data_dir
):
    from distributed_emb.infocse.overlap import Report
    from distributed_emb.infocse.rounds import _next_round_follows

    config = _config(tmp_path, tiny_bert_path, shared_data_dir, ["training.eval.max_pairs=null"])
    worse, better = Report(20, 80.0, None), Report(20, 86.0, None)
    # patience 2: after a first round without gain the next round runs whatever the score.
    assert _next_round_follows(config, 85.0, rounds_without_gain=0)(worse)
    # One round without gain already: only a new best lets another round run.
    follows = _next_round_follows(config, 85.0, rounds_without_gain=1)
    assert follows(better) and not follows(worse)
    # An in-training dev on a subset of STS-B dev is not comparable: every report is mined.
    subset = _config(tmp_path, tiny_bert_path, shared_data_dir)  # training.eval.max_pairs=64
    assert _next_round_follows(subset, 85.0, rounds_without_gain=1)(worse)
    with pytest.raises(ConfigError, match=r"rounds\.overlap"):
        _config(tmp_path, tiny_bert_path, shared_data_dir,
                ["rounds.overlap=true", "supervised.enabled=true"])  # fmt: skip


@pytest.mark.parametrize("failing", ["training", "evaluation"])
def test_a_round_that_fails_after_its_annotation_started_stops_the_mining_thread(
    tmp_path, tiny_bert_path, shared_data_dir, monkeypatch, failing
):
    """With rounds.overlap, a round's failure in training or in its own evaluation closes the
    thread mining the next round's pairs (and its Ray queue) before the error propagates."""
    from types import SimpleNamespace

    from distributed_emb.infocse import rounds

    config = _config(tmp_path, tiny_bert_path, shared_data_dir, ["rounds.overlap=true"])
    closed = []
    follower = SimpleNamespace(feed=object(), close=lambda timeout_s: closed.append(timeout_s))
    trained = SimpleNamespace(model_dir=str(tmp_path / "round_1_model"), metrics={})

    def train(training, callbacks):
        assert callbacks == [follower.feed]  # the round's training feeds the mining thread
        if failing == "training":
            raise RuntimeError("worker lost")
        return trained

    def evaluate(model_dir, config, heldout):
        if model_dir == trained.model_dir:
            raise RuntimeError("dev set unreadable")
        return {"stsb_dev": 80.0, "retrieval_mrr": 0.5, "retrieval_recall_at_1": 0.4}

    monkeypatch.setattr(rounds, "read_documents", lambda spec: SimpleNamespace(dataset=None))
    monkeypatch.setattr(rounds, "_split_held_out", lambda dataset, config: (dataset, None))
    monkeypatch.setattr(rounds, "_initial_model", lambda config, output: tiny_bert_path)
    monkeypatch.setattr(rounds, "_teacher", lambda config: None)
    counts = SimpleNamespace(pairs=0, documents=0, documents_without_pairs=0)
    annotated = SimpleNamespace(counts=counts, wall_seconds=0.0)
    monkeypatch.setattr(rounds, "annotate_documents", lambda *args, **kwargs: annotated)
    monkeypatch.setattr(rounds, "_arranged_pairs_file", lambda *args: ([], 0))
    monkeypatch.setattr(rounds, "_follow_training", lambda *args: follower)
    monkeypatch.setattr(rounds, "_train", train)
    monkeypatch.setattr(rounds, "evaluate_dev", evaluate)

    with pytest.raises(RuntimeError, match="worker lost" if failing == "training" else "dev set"):
        rounds.run_rounds(config)
    assert closed == [0]
