"""A search's progress counts its trials as they end (tune/trial_progress.py): finished and
errored alike, each once, a restored search starting from the trials that ended before."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

from distributed_emb.progress_report import MODE_VARIABLE


def _trial(trial_id: str, status: str) -> SimpleNamespace:
    return SimpleNamespace(trial_id=trial_id, status=status)


def test_every_ended_trial_counts_once(monkeypatch):
    from distributed_emb.tune.trial_progress import TrialProgress

    monkeypatch.setenv(MODE_VARIABLE, "lines")
    callback = pickle.loads(pickle.dumps(TrialProgress(total_trials=4)))  # as Tune keeps it
    # A restored search: one trial ended before the interruption, one runs, two wait.
    trials = [_trial("a", "TERMINATED"), _trial("b", "RUNNING"), _trial("c", "PENDING")]
    callback.on_step_begin(0, trials)
    assert callback.progress.done == 1
    callback.on_trial_complete(1, trials, trials[1])
    trials[1].status = "TERMINATED"
    callback.on_step_begin(2, trials)  # the same trial again: still once
    trials[2].status = "ERROR"
    callback.on_trial_error(3, trials, trials[2])
    assert callback.progress.done == 3 and callback.progress.total == 4
    assert callback.progress.line().startswith("search: 3/4 trials (75%)")
    callback.on_experiment_end(trials)
    assert callback.progress.done == 3
