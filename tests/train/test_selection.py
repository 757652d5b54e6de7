"""eval.select_by: checked against eval.retrieval_dir before Ray starts, and the one rule that
picks the exported evaluation from a history (distributed_emb/selection.py)."""

import pytest
from harness.tiny_run import tiny_beir_dir

from distributed_emb.checks import ConfigError
from distributed_emb.config import TrainingConfig, load_config
from distributed_emb.selection import (
    DEV_METRIC,
    SELECT_METRIC,
    best_row,
    exported_evaluation,
    given_model_round_line,
    is_given_model,
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
    with pytest.raises(
        ConfigError, match=r"^eval\.select_by: 'bm25' is not 'stsb_dev', retrieval:<split>"
    ):
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


def test_a_run_whose_start_won_says_in_one_line_that_it_hands_back_the_given_model():
    start_won = _history((0, 40.0, 80.0), (10, 35.5, 81.0), (20, 37.25, 79.0))
    line = exported_evaluation(start_won, "retrieval:dev", start_is_candidate=True)
    assert line == (
        "exported: the given model unchanged — no trained step beat it on nDCG@10 on "
        "retrieval dev (best trained 37.25 at step 20 vs 40.00 at the start)"
    )
    assert is_given_model(line) and "\n" not in line
    # A trained step that wins, or a start that may not: the exported step.
    trained_won = _history((0, 30.0, 80.0), (10, 35.0, 81.0))
    assert exported_evaluation(trained_won, "stsb_dev", True) == "step 10"
    assert exported_evaluation(start_won, "stsb_dev", False) == "step 20"
    assert not is_given_model("step 20") and not is_given_model(None)
    # Only the start was scored: nothing trained to compare with, said so.
    assert exported_evaluation(_history((0, 40.0, 80.0)), "stsb_dev", True) == (
        "exported: the given model unchanged — no trained step was scored on STS-B dev Spearman"
    )
    assert exported_evaluation([{"step": 5, DEV_METRIC: 80.0}], "stsb_dev", True) is None


def test_rounds_whose_start_won_name_the_best_round_and_the_margin_it_needed():
    what = "nDCG@10 on retrieval dev"
    assert given_model_round_line(what, 2, 41.5, 42.0) == (
        "exported: the given model unchanged — no round beat it on nDCG@10 on retrieval dev "
        "(best round 2: 41.50 vs 42.00)"
    )
    # A round above the start by less than rounds.min_improvement did not beat it.
    assert given_model_round_line(what, 1, 42.2, 42.0, min_improvement=0.5) == (
        "exported: the given model unchanged — no round beat it on nDCG@10 on retrieval dev "
        "by more than 0.5 (best round 1: 42.20 vs 42.00)"
    )
    assert is_given_model(given_model_round_line(what, None, None, 42.0))
