"""InfoCSE's document-level yardstick: the no-argument run chooses its rounds on the dev split
of topic retrieval among its own held-out documents, and those documents are disjoint from
what it annotates and trains on, by construction."""

import json
from pathlib import Path

import pytest
from harness.jobs import checked_config

from distributed_emb.checks import ConfigError
from distributed_emb.data.beir_layout import read_splits
from distributed_emb.evaluation.document_topics import build_topic_set
from distributed_emb.infocse.held_out_documents import (
    DOCUMENTS_EVAL_DIR,
    split_held_out_documents,
)
from distributed_emb.infocse.round_evaluation import selection_field, selection_name
from distributed_emb.infocse.round_state import RoundState
from distributed_emb.infocse.rounds_config import InfoCSEConfig


def test_the_default_run_chooses_rounds_on_its_held_out_documents(tmp_path):
    config = checked_config("train_infocse", [f"output.dir={tmp_path}"])
    assert config.rounds.select_by == "eval" and config.eval.select_by == "documents:dev"
    assert config.heldout.fraction > 0
    assert selection_field(config) == "documents_dev_ndcg_at_10"
    assert selection_name(config) == "nDCG@10 on held-out documents dev"
    # The shipped news set (paraphrase) is reported beside it, never chooses.
    assert config.eval.retrieval_dir == "shipped:news"


def test_choosing_on_documents_needs_held_out_documents(tmp_path):
    with pytest.raises(ConfigError, match=r"^eval\.select_by: documents:dev needs held-out"):
        checked_config("train_infocse", [f"output.dir={tmp_path}", "heldout.fraction=0"])
    with pytest.raises(ConfigError, match=r"^eval\.select_by: documents:test: test splits are"):
        checked_config("train_infocse", [f"output.dir={tmp_path}", "eval.select_by=documents:test"])


def test_held_out_documents_never_reach_annotation_or_training(ray_local, tmp_path):
    lines = Path(__file__).parents[2] / "distributed_emb/resources/corpus/lee_documents.jsonl"
    documents = [
        {"doc_id": row["id"], "sentences": row["sentences"]}
        for row in map(json.loads, lines.read_text().splitlines()[:60])
    ]
    config = InfoCSEConfig()
    config.heldout.fraction, config.heldout.seed = 0.3, 2
    state = RoundState(str(tmp_path), remote=False)
    training, heldout = split_held_out_documents(
        ray_local.data.from_items(documents), config, tmp_path, state
    )
    trained = {row["doc_id"] for row in training.take_all()}
    dev, test = read_splits(heldout.documents_dir, ["dev", "test"])
    evaluated = {pid.split("#")[0] for pid in dev.corpus_ids}
    assert trained and evaluated and not trained & evaluated
    assert heldout.documents_dir == str(tmp_path / DOCUMENTS_EVAL_DIR)
    # What the run wrote is what the plain builder makes of the same documents.
    reference = build_topic_set(documents, 0.3, 2)
    assert dev.corpus_ids == list(reference.passages)
    assert {q: dict(j) for q, j in dev.qrels.items()} == reference.qrels["dev"]
    assert {q: dict(j) for q, j in test.qrels.items()} == reference.qrels["test"]
    # Every document is either trained on or held out (dropped documents aside: none here).
    held = {d["doc_id"] for d in documents} - trained
    assert evaluated <= held and len(trained) + len(held) == len(documents)
