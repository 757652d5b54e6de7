"""eval.select_by: checked against eval.retrieval_dir before Ray starts, and the one rule that
picks the exported evaluation from a history (train/selection.py)."""

import pytest
from harness.tiny_run import tiny_beir_dir

from distributed_emb.config import ConfigError, TrainingConfig, load_config
from distributed_emb.selection import (
    DEV_METRIC,
    SELECT_METRIC,
    best_row,
    scored_splits,
    selected_metric,
)


def _config(*overrides):
    return load_config(TrainingConfig, None, list(overrides))


def test_a_retrieval_choice_needs_a_directory_holding_a_split_that_is_not_test(tmp_path):
    beir = tiny_beir_dir(tmp_path / "beir")  # qrels: dev, test, train
    chosen = _config(f"eval.retrieval_dir={beir}", "eval.select_by=retrieval:dev")
    assert chosen.eval.select_by == "retrieval:dev"
    assert _config().eval.select_by == "stsb_dev"  # the default: STS-B dev, no directory

    with pytest.raises(ConfigError, match=r"^eval\.select_by: retrieval:dev needs eval\.retr"):
        _config("eval.select_by=retrieval:dev")
    with pytest.raises(
        ConfigError,
        match=r"^eval\.select_by: retrieval:test: test splits are reported, never used to choose",
    ):
        _config(f"eval.retrieval_dir={beir}", "eval.select_by=retrieval:test")
    with pytest.raises(
        ConfigError, match=r"^eval\.select_by: .*/qrels has no valid\.tsv; its splits: dev, test, "
    ):
        _config(f"eval.retrieval_dir={beir}", "eval.select_by=retrieval:valid")
    with pytest.raises(ConfigError, match=r"^eval\.select_by: 'bm25' is neither 'stsb_dev' nor"):
        _config("eval.select_by=bm25")
    with pytest.raises(ConfigError, match=r"^eval\.retrieval_dir: .*missing is not a directory"):
        _config(f"eval.retrieval_dir={tmp_path / 'missing'}")
    (tmp_path / "flat").mkdir()
    with pytest.raises(ConfigError, match=r"^eval\.retrieval_dir: .*flat/qrels: no such direct"):
        _config(f"eval.retrieval_dir={tmp_path / 'flat'}")


def test_training_scores_every_split_but_train_and_test_unless_chosen():
    splits = ["dev", "test", "train", "valid"]
    assert scored_splits(splits, "stsb_dev") == ["dev", "valid"]
    assert scored_splits(splits, "retrieval:train") == ["dev", "train", "valid"]
    assert selected_metric("retrieval:valid") == "retrieval_valid_ndcg_at_10"
    assert selected_metric("stsb_dev") == DEV_METRIC


def _history(*rows):
    return [{"step": step, SELECT_METRIC: score, DEV_METRIC: sts} for step, score, sts in rows]


def test_the_best_evaluation_is_the_highest_selection_score_whatever_sts_says():
    # Retrieval chose: step 20 has the best nDCG, though STS-B dev peaked at step 10.
    history = _history((0, 30.0, 80.0), (10, 31.0, 82.0), (20, 35.0, 79.0), (30, 33.0, 81.0))
    assert best_row(history)["step"] == 20
    # The start wins only when it may; a tie goes to the later step (the one Ray Train keeps).
    start = _history((0, 40.0, 80.0), (10, 35.0, 80.0), (20, 35.0, 80.0))
    assert best_row(start)["step"] == 0
    assert best_row(start, start_is_candidate=False)["step"] == 20
    assert best_row(_history((0, 40.0, 80.0)), start_is_candidate=False) is None
    assert best_row([{"step": 5, DEV_METRIC: 80.0}]) is None  # nothing reported a choice
