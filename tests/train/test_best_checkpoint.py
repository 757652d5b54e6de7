"""Which kept checkpoint a run exports: the best selection score (eval.select_by), with or
without the step-0 model."""

from types import SimpleNamespace

from distributed_emb.selection import DEV_METRIC, SELECT_METRIC
from distributed_emb.train.driver import _best_checkpoint


def _result(scores_by_step: dict[int, float], latest: str = "latest"):
    kept = [
        (f"ckpt-{step}", {SELECT_METRIC: score, DEV_METRIC: 80.0, "step": step})
        for step, score in scores_by_step.items()
    ]
    return SimpleNamespace(best_checkpoints=kept, checkpoint=latest)


def test_the_start_wins_when_no_trained_step_beats_it_and_it_may():
    result = _result({0: 86.6, 20: 86.2, 40: 86.0})
    assert _best_checkpoint(result, start_is_candidate=True) == "ckpt-0"


def test_without_the_start_the_best_trained_checkpoint_is_kept():
    result = _result({0: 86.6, 20: 86.2, 40: 86.0})
    assert _best_checkpoint(result, start_is_candidate=False) == "ckpt-20"


def test_a_tie_exports_the_later_checkpoint_which_ray_train_keeps():
    assert _best_checkpoint(_result({20: 40.0, 40: 40.0}), start_is_candidate=True) == "ckpt-40"


def test_only_the_start_kept_falls_back_to_the_latest_checkpoint():
    assert _best_checkpoint(_result({0: 86.6}), start_is_candidate=False) == "latest"
    assert _best_checkpoint(_result({}), start_is_candidate=True) == "latest"
