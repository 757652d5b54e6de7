"""A search's progress in trials (progress_report.Progress): a search of many trials runs for
hours, and Tune's own status table is off in our jobs. A trial counts once it has ended,
finished, stopped early (ASHA) or errored, so the count reaches the total; a resumed search
starts from the trials that ended before it was interrupted."""

from __future__ import annotations

from ray import tune as ray_tune

from distributed_emb.progress_report import Progress

ENDED = ("TERMINATED", "ERROR")  # Tune's statuses of a trial that will not run again


class TrialProgress(ray_tune.Callback):
    """A Tune callback (in the search driver) that counts trials as they end."""

    def __init__(self, total_trials: int) -> None:
        self.total_trials = total_trials
        self.progress: Progress | None = None
        self.counted: set[str] = set()

    def _count(self, ended: set[str]) -> None:
        """Count the trials in `ended` (trial ids) not counted yet."""
        if self.progress is None:  # created in the driver's process, not where it is pickled
            self.progress = Progress("search", self.total_trials, "trials")
        new = ended - self.counted
        self.counted |= new
        if new:
            self.progress.update(len(new))

    @staticmethod
    def _ended(trials) -> set[str]:
        return {t.trial_id for t in trials if t.status in ENDED}

    def on_step_begin(self, iteration, trials, **info) -> None:
        self._count(self._ended(trials))  # every loop: a restored search's earlier trials too

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self._count({trial.trial_id})  # ended, whatever status Tune shows at this moment

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._count({trial.trial_id})

    def on_experiment_end(self, trials, **info) -> None:
        self._count(self._ended(trials))
        if self.progress is not None:
            self.progress.close()

    def __getstate__(self) -> dict:
        # Tune pickles its callbacks with the experiment; a bar or clock does not travel.
        return {**self.__dict__, "progress": None}
