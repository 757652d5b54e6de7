"""InfoCSE rounds in pieces: configuration, the student and teacher, the table and plot, the
stopping rule and failures. The end-to-end runs (annotate → train → evaluate → export, on a
cluster with the state in a bucket) are tests/cluster/test_infocse_object_storage.py."""

import json
from pathlib import Path

import pytest

from distributed_emb.checks import ConfigError
from distributed_emb.config import load_config
from distributed_emb.infocse.round_records import RoundRecord, log_record, save_rounds
from distributed_emb.infocse.round_state import RoundState
from distributed_emb.infocse.rounds_config import InfoCSEConfig
from distributed_emb.plots import write_panels
from distributed_emb.tracking import MetricsSinks, read_train_log


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
            # Self-annotated, the model itself trained, rounds chosen on STS-B dev.
            "annotation.model=null",
            "student.num_layers=null",
            "rounds.select_by=stsb_dev",
            "eval.select_by=stsb_dev",  # the default job's is retrieval:dev on shipped:news
            "rounds.stsb_test=false",
            f"model.path={tiny_bert_path}",
            "train.batch_size=8",
            "train.max_steps=2",
            "train.learning_rate=1.0e-4",
            "eval.eval_steps=2",
            "eval.max_pairs=64",
            "rounds.max_rounds=2",
            "rounds.patience=2",
            f"output.dir={tmp_path / 'out'}",
            *extra,
        ],
    )


def test_config_errors_name_the_section_key(tmp_path, tiny_bert_path, shared_data_dir):
    with pytest.raises(
        ConfigError, match=r"^rounds\.max_rounds: must be >= 1, got 0 — annotate-and-train"
    ):
        _config(tmp_path, tiny_bert_path, shared_data_dir, ["rounds.max_rounds=0"])
    with pytest.raises(ConfigError, match=r"^annotation\.idc\.top_k: must be >= 1, got 0 — "):
        _config(tmp_path, tiny_bert_path, shared_data_dir, ["annotation.idc.top_k=0"])
    with pytest.raises(ConfigError, match=r"^unknown config key 'annotation\.idc\.topk'"):
        _config(tmp_path, tiny_bert_path, shared_data_dir, ["annotation.idc.topk=2"])
    with pytest.raises(
        ConfigError, match=r"^supervised\.source: expected one of \['stsb', 'sick'\], got 'x'"
    ):
        _config(tmp_path, tiny_bert_path, shared_data_dir, ["supervised.source=x"])
    with pytest.raises(ConfigError, match=r"^annotation\.pooler: expected one of \['cls', "):
        _config(tmp_path, tiny_bert_path, shared_data_dir, ["annotation.pooler=max"])
    with pytest.raises(
        ConfigError, match=r"^annotation\.num_cpus_per_actor: must be > 0 or null, got 0"
    ):
        _config(tmp_path, tiny_bert_path, shared_data_dir, ["annotation.num_cpus_per_actor=0"])
    with pytest.raises(ConfigError, match=r"^documents\.min_sentences: must be >= 1, got 0"):
        _config(tmp_path, tiny_bert_path, shared_data_dir, ["documents.min_sentences=0"])
    with pytest.raises(ConfigError, match=r"^documents\.paths: is empty"):
        _config(tmp_path, tiny_bert_path, shared_data_dir, ["documents.paths=[]"])
    with pytest.raises(ConfigError, match=r"^loss\.temperature"):
        _config(tmp_path, tiny_bert_path, shared_data_dir, ["loss.temperature=0"])
    with pytest.raises(ConfigError, match="documents.paths"):
        _config(tmp_path, tiny_bert_path, shared_data_dir, ["documents.paths=[/no/such.jsonl]"])


def test_every_round_annotates_at_the_initial_models_length(tmp_path, tiny_bert_path):
    from distributed_emb.infocse.annotate import AnnotationConfig
    from distributed_emb.infocse.round_annotation import with_fixed_length
    from distributed_emb.model.sentence_transformer import load_sentence_transformer

    initial = tmp_path / "initial"
    load_sentence_transformer(tiny_bert_path, pooler="mean", max_seq_length=48).save(str(initial))
    resolved = with_fixed_length(AnnotationConfig(), str(initial))
    assert resolved.max_seq_length == 48  # not a later round's export's training length
    assert with_fixed_length(AnnotationConfig(max_seq_length=20), str(initial)).max_seq_length == 20


def test_every_round_is_plotted_and_logged_to_the_sinks(tmp_path, monkeypatch):
    """rounds.png holds STS-B dev, retrieval and mined pairs per round (InfoCSE++ steps as
    their own lines); rounds_log.jsonl and TensorBoard one row per round."""
    from distributed_emb.infocse import round_records
    from distributed_emb.logging_config import LoggingConfig

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

    monkeypatch.setattr(round_records, "write_panels", record_plot)
    sinks = MetricsSinks.start(LoggingConfig(), tmp_path, {}, "test", log_name="rounds_log.jsonl")
    for record in records:
        log_record(record, sinks)
    sinks.close()
    save_rounds(
        records, records[2], tmp_path, RoundState(str(tmp_path), remote=False), InfoCSEConfig()
    )
    saved = json.loads((tmp_path / "rounds.json").read_text())
    assert saved["best"]["stage"] == "supervised" and len(saved["rounds"]) == 4
    assert saved["settings"]["rounds.select_by"] == "stsb_dev"  # what a restart checks
    assert saved["regime"] == "given model" and "exported" not in saved  # not exported yet

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

    from distributed_emb.infocse.rounds import initial_model, teacher_model

    config = _config(tmp_path, tiny_bert_path, shared_data_dir)
    state = RoundState(str(tmp_path), remote=False)
    assert initial_model(config, tmp_path, state) == tiny_bert_path  # no student: the model
    assert teacher_model(config) is None  # no teacher: every round self-annotated
    config = _config(
        tmp_path, tiny_bert_path, shared_data_dir,
        ["student.num_layers=1", "annotation.model=source"],
    )  # fmt: skip
    student = initial_model(config, tmp_path, state)
    assert student == str(tmp_path / "student")
    assert AutoConfig.from_pretrained(student).num_hidden_layers == 1
    assert teacher_model(config) == tiny_bert_path  # "source": the uncut model
    with pytest.raises(ConfigError, match=r"^heldout\.fraction: must be in \[0, 1\), got 1\.0 — "):
        _config(tmp_path, tiny_bert_path, shared_data_dir, ["heldout.fraction=1.0"])
    with pytest.raises(ConfigError, match=r"^student\.num_layers: must be >= 1 or null, got 0"):
        _config(tmp_path, tiny_bert_path, shared_data_dir, ["student.num_layers=0"])


def test_held_out_retrieval_is_a_row_column_and_a_panel(tmp_path):
    from distributed_emb.infocse.round_records import format_table, rounds_panels

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


def test_overlap_mines_only_for_a_round_the_stopping_rule_would_run(
    tmp_path, tiny_bert_path, shared_data_dir
):
    from distributed_emb.infocse.overlap import Report
    from distributed_emb.infocse.round_evaluation import next_round_follows

    config = _config(tmp_path, tiny_bert_path, shared_data_dir, ["eval.max_pairs=null"])
    worse, better = Report(20, 80.0, None), Report(20, 86.0, None)
    # patience 2: after a first round without gain the next round runs whatever the score.
    assert next_round_follows(config, 85.0, rounds_without_gain=0)(worse)
    # One round without gain already: only a new best lets another round run.
    follows = next_round_follows(config, 85.0, rounds_without_gain=1)
    assert follows(better) and not follows(worse)
    # An in-training dev on a subset of STS-B dev is not comparable: every report is mined.
    subset = _config(tmp_path, tiny_bert_path, shared_data_dir)  # eval.max_pairs=64
    assert next_round_follows(subset, 85.0, rounds_without_gain=1)(worse)
    # Rounds and training choosing on the same retrieval split: its in-training score counts.
    from harness.tiny_run import tiny_beir_dir

    own_dev = [f"eval.retrieval_dir={tiny_beir_dir(tmp_path / 'beir')}",
               "eval.select_by=retrieval:dev"]  # fmt: skip
    same = _config(tmp_path, tiny_bert_path, shared_data_dir, [*own_dev, "rounds.select_by=eval"])
    follows = next_round_follows(same, 85.0, rounds_without_gain=1)
    assert follows(better) and not follows(worse)
    # Rounds on STS-B dev, training on retrieval: the reports' scores are not the rounds'.
    apart = _config(tmp_path, tiny_bert_path, shared_data_dir, [*own_dev, "eval.max_pairs=null"])
    assert next_round_follows(apart, 85.0, rounds_without_gain=1)(worse)
    with pytest.raises(ConfigError, match=r"rounds\.overlap"):
        _config(tmp_path, tiny_bert_path, shared_data_dir,
                ["rounds.overlap=true", "supervised.enabled=true"])  # fmt: skip


def _rounds_with_fake_steps(monkeypatch, tmp_path, tiny_bert_path, train, evaluate, follower=None):
    """infocse.rounds with its steps replaced: no documents, no held-out split, the given
    model as round 0, no teacher, annotation that writes nothing, `train` and `evaluate` for
    the round's training and scoring, `follower` for rounds.overlap's mining thread."""
    from types import SimpleNamespace

    from distributed_emb.infocse import round_annotation, rounds
    from distributed_emb.infocse.annotate import AnnotationResult
    from distributed_emb.infocse.annotation_tables import AnnotationCounts

    monkeypatch.setattr(rounds, "read_documents", lambda spec: SimpleNamespace(dataset=None))
    monkeypatch.setattr(rounds, "split_held_out_documents", lambda dataset, *_: (dataset, None))
    monkeypatch.setattr(rounds, "initial_model", lambda config, output, state: tiny_bert_path)
    monkeypatch.setattr(rounds, "teacher_model", lambda config: None)
    annotated = AnnotationResult(AnnotationCounts(), 0.0, str(tmp_path / "pairs"))
    monkeypatch.setattr(round_annotation, "annotate_documents", lambda *args, **kwargs: annotated)
    monkeypatch.setattr(round_annotation, "_follow_training", lambda *args: follower)
    monkeypatch.setattr(rounds, "train_stage", train)
    monkeypatch.setattr(rounds, "evaluate_dev", evaluate)
    return rounds


_START_SCORES = {"stsb_dev": 80.0, "retrieval_mrr": 0.5, "retrieval_recall_at_1": 0.4}


@pytest.mark.parametrize("failing", ["training", "evaluation"])
def test_a_round_that_fails_after_its_annotation_started_stops_the_mining_thread(
    tmp_path, tiny_bert_path, shared_data_dir, monkeypatch, failing
):
    """With rounds.overlap, a round's failure in training or in its own evaluation closes the
    thread mining the next round's pairs (and its Ray queue) before the error propagates."""
    from types import SimpleNamespace

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
        return _START_SCORES

    rounds = _rounds_with_fake_steps(
        monkeypatch, tmp_path, tiny_bert_path, train, evaluate, follower
    )
    with pytest.raises(RuntimeError, match="worker lost" if failing == "training" else "dev set"):
        rounds.run_rounds(config)
    assert closed == [0]


def test_with_a_storage_path_the_drivers_files_are_stored_as_each_round_finishes(
    tmp_path, tiny_bert_path, shared_data_dir, monkeypatch
):
    """output.storage_path: what the driver's output directory holds of the rounds (its log
    lines, rounds_log.jsonl, TensorBoard, the plot) is also beside the rounds' state, written
    when a round finishes, not when the run does: round 1's training finds round 0's there.
    A restarted run's lines join the earlier attempt's in one run.log; output.resume=overwrite
    starts the stored logs afresh."""
    import re

    bucket = tmp_path / "bucket"
    config = _config(
        tmp_path, tiny_bert_path, shared_data_dir,
        [f"output.storage_path={bucket}", "output.run_name=stored"],
    )  # fmt: skip
    root, output = bucket / "stored", tmp_path / "out"
    seen = []

    def train(training, callbacks):
        seen.append(
            {
                "run.log": (root / "logs" / "run.log").read_text(),
                "rows": read_train_log(root / "logs" / "rounds_log.jsonl"),
                "plot": (root / "rounds.png").read_bytes()[:4],
                "rounds": json.loads((root / "rounds.json").read_text())["rounds"],
            }
        )
        raise RuntimeError("worker lost")

    rounds = _rounds_with_fake_steps(
        monkeypatch, tmp_path, tiny_bert_path, train, lambda *args: _START_SCORES
    )
    with pytest.raises(RuntimeError, match="worker lost"):
        rounds.run_rounds(config)
    (first,) = seen
    assert re.search(r"InfoCSE +0 +initial ", first["run.log"])
    assert [(row["kind"], row["step"]) for row in first["rows"]] == [("rounds", 0)]
    assert first["plot"] == b"\x89PNG" and [r["round"] for r in first["rounds"]] == [0]
    if (output / "tensorboard").is_dir():  # tensorboardX or tensorboard installed
        stored = {path.name for path in (root / "logs" / "tensorboard").iterdir()}
        assert stored == {path.name for path in (output / "tensorboard").iterdir()}

    # The run again (output.resume=auto): it continues, and its lines join the first's.
    with pytest.raises(RuntimeError, match="worker lost"):
        rounds.run_rounds(config)
    run_log = (root / "logs" / "run.log").read_text()
    assert run_log.index("InfoCSE") < run_log.index("continuing the rounds in")
    assert len(list((root / "logs" / "parts").iterdir())) == 2
    config.training.output.resume = "overwrite"
    with pytest.raises(RuntimeError, match="worker lost"):
        rounds.run_rounds(config)
    assert len(list((root / "logs" / "parts").iterdir())) == 1
    assert "continuing the rounds" not in (root / "logs" / "run.log").read_text()


def test_rounds_are_chosen_and_stopped_on_the_selected_dev_score(
    tmp_path, tiny_bert_path, shared_data_dir
):
    """rounds.select_by names the dev score that picks the export and counts rounds without
    gain; the held-out test half and STS-B test never choose."""
    from distributed_emb.infocse.round_evaluation import standing

    def record(index, stsb_dev, heldout_dev_mrr, heldout_mrr):
        return RoundRecord(index, "initial" if index == 0 else "infocse", f"m{index}",
                           stsb_dev=stsb_dev, heldout_dev_mrr=heldout_dev_mrr,
                           heldout_mrr=heldout_mrr, stsb_test=99.0 - index)  # fmt: skip

    records = [
        record(0, 80.0, 40.0, 40.0),
        record(1, 79.0, 45.0, 30.0),
        record(2, 78.0, 44.0, 60.0),
    ]
    selected = ["rounds.select_by=heldout_dev_mrr", "heldout.fraction=0.2"]
    by_retrieval = _config(tmp_path, tiny_bert_path, shared_data_dir, selected)
    best, without_gain = standing(records, by_retrieval)
    assert (best.round, without_gain) == (1, 1)
    by_sts = _config(tmp_path, tiny_bert_path, shared_data_dir)
    assert [(r.round, n) for r, n in [standing(records, by_sts)]] == [(0, 2)]
    with pytest.raises(ConfigError, match=r"rounds\.select_by"):
        _config(tmp_path, tiny_bert_path, shared_data_dir,
                ["rounds.select_by=heldout_dev_mrr", "heldout.fraction=0"])  # fmt: skip
    # rounds.select_by=eval: what eval.select_by names, STS-B dev by default...
    follows_eval = _config(tmp_path, tiny_bert_path, shared_data_dir, ["rounds.select_by=eval"])
    assert standing(records, follows_eval)[0].round == 0
    # ...or nDCG@10 on the user's BEIR dev split, which every round's record carries.
    from harness.tiny_run import tiny_beir_dir

    by_own_dev = _config(tmp_path, tiny_bert_path, shared_data_dir, [
        "rounds.select_by=eval", f"eval.retrieval_dir={tiny_beir_dir(tmp_path / 'beir')}",
        "eval.select_by=retrieval:dev",
    ])  # fmt: skip
    for record, ndcg in zip(records, (30.0, 29.0, 33.0), strict=True):
        record.eval_retrieval_ndcg_at_10 = ndcg
    assert [(r.round, n) for r, n in [standing(records, by_own_dev)]] == [(2, 0)]
    with pytest.raises(ConfigError, match="rounds.arrange_pairs was removed"):
        _config(tmp_path, tiny_bert_path, shared_data_dir, ["rounds.arrange_pairs=false"])


def _round(index, stage, stsb_dev, model_dir=None):
    return RoundRecord(index, stage, model_dir or f"m{index}", stsb_dev=stsb_dev,
                       retrieval_mrr=0.5, retrieval_recall_at_1=0.4)  # fmt: skip


def test_rounds_say_when_they_hand_back_the_given_model_and_name_the_student_regime(
    tmp_path, tiny_bert_path
):
    """exported_line: the one line when round 0, model.path itself, beat every round; else
    the round. regime_line: the student named as such (console, card). Both in rounds.json."""
    from distributed_emb.infocse import round_export

    given = load_config(InfoCSEConfig, None, [f"model.path={tiny_bert_path}"])
    start_won = [_round(0, "initial", 80.0), _round(1, "infocse", 79.5),
                 _round(2, "infocse", 78.0)]  # fmt: skip
    line = round_export.exported_line(start_won, given)
    assert line == (
        "exported: the given model unchanged — no round beat it on STS-B dev Spearman "
        "(best round 1: 79.50 vs 80.00)"
    )
    trained_won = [_round(0, "initial", 80.0), _round(1, "infocse", 81.0)]
    assert round_export.exported_line(trained_won, given) == "round 1 (infocse)"

    student = load_config(
        InfoCSEConfig, None, [f"model.path={tiny_bert_path}", "student.num_layers=1"]
    )
    # Round 0 of a student is the cut model: not the given one, whatever won.
    assert round_export.exported_line(start_won, student) == "round 0 (initial)"
    assert round_export.regime_line(student) == (
        f"regime: student — the first 1 of 2 layers of {tiny_bert_path}; the export is the "
        "student, not the given model"
    )
    card_name = Path(tiny_bert_path).name  # no path of this machine on the card
    assert round_export.regime_line(student, for_card=True).startswith(
        f"regime: student — the first 1 of 2 layers of {card_name};"
    )
    packaged = load_config(InfoCSEConfig, None, ["student.num_layers=3"])
    assert round_export.regime_line(packaged).startswith(
        "regime: student — the first 3 of 6 layers of sentence-transformers/all-MiniLM-L6-v2;"
    )

    state = RoundState(str(tmp_path), remote=False)
    save_rounds(trained_won, trained_won[1], tmp_path, state, student, "round 1 (infocse)")
    saved = json.loads((tmp_path / "rounds.json").read_text())
    assert (saved["regime"], saved["student_layers"], saved["exported"]) == (
        "student",
        1,
        "round 1 (infocse)",
    )
    save_rounds(start_won, start_won[0], tmp_path, state, given, line)
    saved = json.loads((tmp_path / "rounds.json").read_text())
    assert (saved["regime"], saved["exported"]) == ("given model", line)
    assert "student_layers" not in saved


def test_the_exports_card_names_the_student_regime_or_the_given_model_handed_back(
    tmp_path, tiny_bert_path
):
    from distributed_emb.infocse import round_export
    from distributed_emb.model.model_card import SECTION_TITLE, card_bullet

    def model_dir(name, card):
        directory = tmp_path / name
        directory.mkdir()
        (directory / "modules.json").write_text("[]")
        (directory / "README.md").write_text(card)
        return str(directory)

    output = tmp_path / "out"
    output.mkdir()
    state = RoundState(str(output), remote=False)
    round_card = f"# round 1\n\n{SECTION_TITLE}\n\n- **Method:** InfoCSE-style\n"
    best = _round(1, "infocse", 81.0, model_dir("round_1", round_card))
    student = load_config(
        InfoCSEConfig, None, [f"model.path={tiny_bert_path}", "student.num_layers=1"]
    )
    round_export.export_best(best, output, student, state, "round 1 (infocse)")
    card = (output / "model" / "README.md").read_text()
    assert card_bullet(round_export.regime_line(student, for_card=True)) in card
    assert "- **Method:** InfoCSE-style" in card and "given model unchanged" not in card
    assert (tmp_path / "round_1" / "README.md").read_text() == round_card  # the copy only

    given = load_config(InfoCSEConfig, None, [f"model.path={tiny_bert_path}"])
    start = _round(0, "initial", 80.0, model_dir("given", "# the given model's own card\n"))
    line = round_export.exported_line([start, _round(1, "infocse", 79.0)], given)
    round_export.export_best(start, output, given, state, line)
    card = (output / "model" / "README.md").read_text()
    assert card.startswith("# the given model's own card\n")
    assert card_bullet(line) in card and "Regime" not in card
