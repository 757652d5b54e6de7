"""InfoCSE rounds on a cluster in a box (tests/harness/autoscaling_cluster.py) with their state
on an S3-protocol server on 127.0.0.1, as a user runs them: `ray job submit` of
jobs/train_infocse.py with `output.storage_path=s3://...`.

Shape as in cluster/aws.yaml: a head with no CPU (the driver, the Train controller) and a fake
worker node of 3 CPUs that runs the annotation actor, the Ray Data tasks and the Train worker
(one of each: that the driver's disk is not theirs is what is tested here; several workers and
annotators are tested in tests/train and tests/infocse. Two of each took 370 core-seconds, one
267). Every round's model, pairs and table are in the bucket, and so is everything the
driver writes (its log, the plot, the sinks' files, the card): the driver's --output holds a
copy of the logs and of the final model, never a round directory.

Two job runs on one cluster serve every assertion (2–3 min on 2 cores):
- `first`: a 1-layer student, a quarter of the documents held out, rounds chosen on the
  held-out dev half's retrieval, rounds.overlap. Round 1's pairs are mined by a teacher
  before training (sequential, overlap off: a teacher's pairs do not wait for a training);
  round 2's pairs are mined by the student while round 1 trains (overlap on), from a
  checkpoint read out of the bucket;
- `restarted`: the same job again after round 2's row is taken out of rounds.json in the
  bucket (the driver died after round 2 trained): round 1 is not run again, round 2's
  committed pairs are not mined again and its training continues from its checkpoint there.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness.autoscaling_cluster import RAY_CLI, job_runtime_env, local_cluster, wait_for

# Slow: a cluster in a box and two submitted InfoCSE jobs (about 3 min on 2 cores).
pytestmark = [pytest.mark.ray, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Run:
    output: Path  # the driver's --output
    root: str  # the rounds' state: s3://<bucket>/runs/<name>
    logs: str  # what `ray job submit` printed
    rounds: dict  # rounds.json from the bucket, as the run left it
    teacher: str

    def records(self) -> list[dict]:
        return self.rounds["rounds"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_bert_path, shared_data_dir, s3):
    from conftest import build_tiny_bert

    from distributed_emb import storage

    tmp = tmp_path_factory.mktemp("infocse_storage")
    documents = tmp / "docs.jsonl"
    lines = (shared_data_dir / "corpus" / "lee_documents.jsonl").read_text().splitlines()[:24]
    documents.write_text("\n".join(lines) + "\n")
    teacher = build_tiny_bert(tmp / "teacher", seed=1)
    bucket = s3.create_bucket(f"infocse-{secrets.token_hex(3)}")
    common = [
        f"documents.paths=[{documents}]",
        "annotation.pooler=mean",
        "annotation.max_seq_length=32",
        "annotation.model=null",
        "student.num_layers=null",
        "rounds.stsb_test=false",
        "annotation.concurrency=1",
        "annotation.num_cpus_per_actor=1",
        f"model.path={tiny_bert_path}",
        "train.num_workers=1",
        "train.cpus_per_worker=1",
        "train.batch_size=8",
        "train.max_steps=2",
        "train.learning_rate=1.0e-4",
        "eval.eval_steps=2",
        "eval.max_pairs=64",
        "rounds.max_rounds=2",
        "rounds.patience=2",
        "rounds.overlap=true",
        "rounds.select_by=heldout_dev_mrr",
        "student.num_layers=1",
        f"annotation.model={teacher}",
        "heldout.fraction=0.25",
        "heldout.seed=1",
        f"output.storage_path={bucket}/runs",
        "output.run_name=rounds",
    ]
    output = tmp / "out"

    def submit() -> Run:
        command = [
            RAY_CLI, "job", "submit", "--address", cluster.dashboard_url,
            "--runtime-env-json", job_runtime_env(s3.env), "--",
            sys.executable, str(REPO / "jobs" / "train_infocse.py"),
            *common, "--output", str(output),
        ]  # fmt: skip
        done = subprocess.run(
            command, cwd=REPO, env=cluster.client_env(), capture_output=True, text=True,
            timeout=900,
        )  # fmt: skip
        logs = done.stdout + done.stderr
        assert done.returncode == 0, logs[-6000:]
        root = f"{bucket}/runs/rounds"
        return Run(output, root, logs, json.loads(storage.read_text(f"{root}/rounds.json")),
                   teacher)  # fmt: skip

    found = {}
    with local_cluster(worker_cpus=3, max_workers=1, min_workers=1) as cluster:
        wait_for(lambda: len(cluster.alive_worker_nodes()) == 1, 120, "a worker node")
        found["first"] = submit()
        # The driver dies after round 2 trained, before its row reached rounds.json.
        state = found["first"].rounds
        cut = {**state, "rounds": state["rounds"][:2]}
        storage.write_text(f"{found['first'].root}/rounds.json", json.dumps(cut))
        found["restarted"] = submit()
    return found


def test_the_rounds_state_is_in_the_bucket_and_the_driver_keeps_logs_and_the_model(runs, s3):
    from distributed_emb import storage

    for run in (runs["first"], runs["restarted"]):
        records = run.records()
        assert [(r["round"], r["stage"]) for r in records] == [
            (0, "initial"), (1, "infocse"), (2, "infocse"),
        ]  # fmt: skip
        for record in records[1:]:
            # Each round's model and pairs are in the bucket, where every node reads them.
            assert record["model_dir"].startswith(f"{run.root}-round_{record['round']}-train/")
            assert record["pairs_location"].startswith(run.root + "/")
            assert storage.exists(f"{record['model_dir']}/model.safetensors")
            source = json.loads(storage.read_text(f"{run.root}/round_{record['round']}/"
                                                  "pairs_source.json"))  # fmt: skip
            assert source["pairs"] == record["pairs_location"]
            assert source["counts"]["pairs"] == record["pairs"] > 0
            assert storage.exists(f"{run.root}/round_{record['round']}/train/run.log")
        assert storage.exists(f"{run.root}/model/modules.json")
        assert storage.exists(f"{run.root}/rounds.md")
        # The driver's --output: logs, the table and the final model; no round directory.
        kept = sorted(path.name for path in run.output.iterdir())
        assert not [name for name in kept if name.startswith("round_")], kept
        assert {"model", "rounds.json", "rounds.md", "rounds.png", "run.log"} <= set(kept)
    local = json.loads((runs["restarted"].output / "rounds.json").read_text())
    assert local["rounds"] == runs["restarted"].records()  # a copy of the bucket's


def test_what_the_driver_writes_is_in_the_bucket_too(runs):
    """The driver's --output is one node's disk: its log lines (both attempts', merged),
    rounds_log.jsonl, TensorBoard events, the plot, the teacher's scores and the export's card
    (with the comparison's lines, added after the model was put there) are beside the rounds'
    state as well (tests/infocse/test_rounds.py: written as each round finishes)."""
    from distributed_emb import storage
    from distributed_emb.tracking import read_train_log

    first, again = runs["first"], runs["restarted"]
    root = again.root
    run_log = storage.read_text(f"{root}/logs/run.log")
    assert len(storage.list_files(f"{root}/logs/parts")) == 2  # one part per attempt
    assert run_log.index("regime: student") < run_log.index(f"teacher {first.teacher}: ")
    assert run_log.index(f"teacher {first.teacher}: ") < run_log.index("continuing the rounds")
    assert run_log.index("continuing the rounds") < run_log.rindex("best: round ")
    stored_rows = read_train_log(f"{root}/logs/rounds_log.jsonl")
    assert stored_rows == read_train_log(again.output / "rounds_log.jsonl")
    if (again.output / "tensorboard").is_dir():
        assert storage.list_files(f"{root}/logs/tensorboard")
    assert storage.read_bytes(f"{root}/rounds.png")[:4] == b"\x89PNG"
    assert json.loads(storage.read_text(f"{root}/teacher.json"))["model"] == first.teacher
    card = (again.output / "model" / "README.md").read_text()
    assert storage.read_text(f"{root}/model/README.md") == card


def test_two_rounds_annotate_train_and_export_the_best(runs):
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from distributed_emb.storage import local_model_dir
    from distributed_emb.tracking import read_train_log

    run = runs["first"]
    records = run.records()
    assert all(r["train_steps"] == 2 and r["kept_step"] == 2 for r in records[1:])
    assert records[1]["overlap_with_previous"] is None
    assert 0.0 <= records[2]["overlap_with_previous"] <= 1.0
    # Chosen on the held-out dev half (rounds.select_by); the test half is only reported.
    best = run.rounds["best"]
    assert best["heldout_dev_mrr"] == max(r["heldout_dev_mrr"] for r in records)
    assert all(r["heldout_mrr"] is not None for r in records)
    sentences = ["A man is playing a guitar.", "The stock market fell."]
    exported = SentenceTransformer(str(run.output / "model"), device="cpu").encode(sentences)
    from_bucket = SentenceTransformer(local_model_dir(f"{run.root}/model"), device="cpu")
    np.testing.assert_allclose(from_bucket.encode(sentences), exported, rtol=1e-6, atol=1e-6)
    if best["stage"] != "initial":
        reference = SentenceTransformer(local_model_dir(best["model_dir"]), device="cpu")
        np.testing.assert_allclose(reference.encode(sentences), exported, rtol=1e-6, atol=1e-6)
    # The sinks log one row per round; a round's start is scored by the rounds, not again by
    # its training (eval.score_start=false).
    logged = read_train_log(run.output / "rounds_log.jsonl")
    # The restarted run's sinks: the earlier rounds' rows again, then round 2's.
    assert [(r["kind"], r["step"]) for r in logged] == [("rounds", 0), ("rounds", 1), ("rounds", 2)]


def test_overlapped_annotation_mines_the_next_rounds_pairs_with_the_kept_checkpoint(
    runs, shared_data_dir
):
    """Round 1's registered checkpoint reaches the driver through the Train controller's
    callback, round 2's pairs are mined with it (exported into the bucket, read by the actors)
    while round 1 finishes, and they are exactly the pairs round 1's model mines after
    training (a single-process reference)."""
    from distributed_emb.data.held_out import held_out_split
    from distributed_emb.infocse.annotate import AnnotationConfig, annotate_documents_locally
    from distributed_emb.infocse.pairs import read_pairs
    from distributed_emb.storage import exists, local_model_dir

    run = runs["first"]
    records = run.records()
    assert [r["mined_at_step"] for r in records] == [None, None, 2]
    assert records[2]["overlapped_annotate_s"] > 0
    versions = f"{run.root}/round_1/next_round_pairs"
    assert records[2]["pairs_location"] == f"{versions}/step_2/pairs"
    assert not exists(f"{versions}/step_2/model")  # the mining model is gone once adopted

    lines = (shared_data_dir / "corpus" / "lee_documents.jsonl").read_text().splitlines()[:24]
    documents = [json.loads(line) for line in lines]
    training = [{"doc_id": d["id"], "sentences": d["sentences"]} for d in documents
                if held_out_split(d["id"], 0.25, seed=1) is None]  # fmt: skip
    expected, reference = annotate_documents_locally(
        training, local_model_dir(records[1]["model_dir"]), round_index=2,
        config=AnnotationConfig(pooler="mean", max_seq_length=32),
    )  # fmt: skip

    def key(rows):
        return sorted((r["doc_id"], r["anchor"], r["positive"], r["round"]) for r in rows)

    assert key(read_pairs(records[2]["pairs_location"])) == key(expected)
    assert records[2]["pairs"] == reference.counts.pairs


def test_teacher_annotates_round_one_the_student_the_rest_held_out_documents_unseen(
    runs, shared_data_dir
):
    """A 1-layer student (cut on the driver, put in the bucket for the nodes); a different
    tiny BERT as teacher for round 1. Round 1's pairs are exactly the teacher's (single-process
    reference) on the training documents; no pair comes from a held-out document."""
    from transformers import AutoConfig

    from distributed_emb.data.held_out import held_out_doc_ids
    from distributed_emb.infocse.annotate import AnnotationConfig, annotate_documents_locally
    from distributed_emb.infocse.pairs import read_pairs
    from distributed_emb.storage import local_model_dir

    run = runs["first"]
    records = run.records()
    assert records[0]["model_dir"] == f"{run.root}/student"
    student = AutoConfig.from_pretrained(local_model_dir(records[0]["model_dir"]))
    assert student.num_hidden_layers == 1
    assert [r["annotated_by"] for r in records] == [None, "teacher", "self"]
    assert all(r["heldout_mrr"] is not None for r in records)

    lines = (shared_data_dir / "corpus" / "lee_documents.jsonl").read_text().splitlines()[:24]
    documents = [json.loads(line) for line in lines]
    held = held_out_doc_ids([d["id"] for d in documents], 0.25, seed=1)
    assert 0 < len(held) < len(documents)
    training = [{"doc_id": d["id"], "sentences": d["sentences"]} for d in documents
                if d["id"] not in held]  # fmt: skip
    annotation = AnnotationConfig(pooler="mean", max_seq_length=32)
    expected, _ = annotate_documents_locally(training, run.teacher, 1, config=annotation)

    def key(rows):
        return sorted((r["doc_id"], r["anchor"], r["positive"]) for r in rows)

    round_1 = read_pairs(records[1]["pairs_location"])
    assert key(round_1) == key(expected)
    round_2 = read_pairs(records[2]["pairs_location"])
    assert not {r["doc_id"] for r in round_1 + round_2} & held


def test_the_student_regime_is_named_on_the_console_in_rounds_json_and_on_the_card(
    runs, tiny_bert_path
):
    """student.num_layers: the run says at its start that it trains a student, rounds.json
    records the regime and what was exported, and the export's card says it is the student."""
    run = runs["first"]
    assert (
        f"regime: student — the first 1 of 2 layers of {tiny_bert_path}; the export is the "
        "student, not the given model"
    ) in run.logs
    assert (run.rounds["regime"], run.rounds["student_layers"]) == ("student", 1)
    best = run.rounds["best"]
    assert run.rounds["exported"] == f"round {best['round']} ({best['stage']})"
    card = (run.output / "model" / "README.md").read_text()
    assert (
        f"- **Regime:** student — the first 1 of 2 layers of {Path(tiny_bert_path).name};" in card
    )
    assert "given model unchanged" not in card


def test_a_restarted_run_continues_its_rounds_from_the_bucket(runs):
    """The rerun finds rounds 0 and 1 in rounds.json and round 2's committed pairs: it scores
    nothing again, mines nothing again, and round 2's training resumes from its checkpoint."""
    first, again = runs["first"], runs["restarted"]
    assert "continuing the rounds in " + first.root + " after round 1" in again.logs
    assert again.records()[:2] == first.records()[:2]
    resumed = again.records()[2]
    assert resumed["resumed"] and not first.records()[2]["resumed"]
    assert "its pairs were committed by an earlier attempt" in again.logs
    assert resumed["pairs_location"] == first.records()[2]["pairs_location"]
    assert resumed["pairs"] == first.records()[2]["pairs"]
    assert "resuming run 'rounds-round_2-train'" in again.logs
    assert resumed["train_steps"] == 2
