"""Annotation that overlaps training (`rounds.overlap=true`): while round r trains, the next
round's pairs are mined with round r's best checkpoint so far.

Sequential rounds leave one side idle: the annotation actors wait while the Train workers
train, and the workers wait while the actors annotate. Here the Train controller sends every
checkpoint it registers to the driver (:class:`CheckpointFeed`, a Ray Train callback, through a
Ray queue); a driver thread (:class:`NextRoundAnnotator`) takes the best trained checkpoint so
far by the training's selection score (eval.select_by: selection.py), exports it and
annotates the documents with it while training goes on, one annotation at a time (a newer best
that arrives meanwhile is mined next; the ones in between are skipped). Each annotation is a
*version* (:class:`PairVersions`): its own directory, readable only once its COMMIT file is
written, so a half-written version is never trained on.

When round r's training ends, its kept step k is known:
- the version mined with step k, committed or still running (then awaited), is the next
  round's pairs: exactly the pairs sequential rounds would mine, since round r's model *is*
  checkpoint k;
- otherwise the freshest version (committed, or the one running, awaited) is used: pairs
  mined by an earlier checkpoint of the same training, as a bounded pair buffer would serve;
- with no version at all (the best came with the last report), the next round annotates
  after training, as sequential rounds do.

Resources: the overlapping annotation pool reserves no CPU (it would take the whole CPU
that Ray Data's tasks need beside the Train workers, and training would stall); its actors
share the cores with training, so on a machine whose cores training already fills the gain is
the idle time of each side (start-ups, evaluations, exports), and on a cluster whose annotation
actors have nodes (GPUs) of their own it is the overlapped annotation time.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from ray.train import UserCallback

from distributed_emb import storage
from distributed_emb.infocse.annotation_tables import AnnotationCounts
from distributed_emb.selection import SELECT_METRIC

log = logging.getLogger(__name__)

COMMIT_FILE = "COMMIT"


@dataclass(frozen=True)
class Report:
    """One checkpoint Ray Train registered: its step, selection score (eval.select_by) and
    location on storage."""

    step: int
    score: float
    checkpoint: object  # ray.train.Checkpoint


@dataclass(frozen=True)
class PairVersion:
    """Pairs mined with the model of one checkpoint (`step`) of the training that ran."""

    step: int
    score: float  # the checkpoint's selection score (eval.select_by)
    pairs_dir: str
    counts: AnnotationCounts
    annotate_s: float  # the annotation's own wall time, overlapped with training


class PairVersions:
    """Versioned pair directories under `root` (a local path or on object storage, where the
    annotation actors of every node write and read): `step_<s>/model/` (the checkpoint's
    export), `step_<s>/pairs/` (Parquet) and `step_<s>/COMMIT` (JSON), written last and whole.
    A version without COMMIT is in flight or abandoned and is never read."""

    def __init__(self, root: str | Path) -> None:
        self.root = str(root)

    def location(self, step: int) -> str:
        return storage.join(self.root, f"step_{step}")

    def start(self, step: int) -> str:
        """A fresh directory for the version of `step` (an abandoned one is cleared)."""
        directory = self.location(step)
        storage.delete_tree(directory)
        if not storage.is_remote(directory):
            Path(directory).mkdir(parents=True)
        return directory

    def commit(self, version: PairVersion) -> None:
        payload = {**asdict(version), "counts": asdict(version.counts)}
        storage.write_text(storage.join(self.location(version.step), COMMIT_FILE),
                           json.dumps(payload))  # fmt: skip

    def _read(self, directory: str) -> PairVersion | None:
        text = storage.read_text(storage.join(directory, COMMIT_FILE))
        if text is None:
            return None
        data = json.loads(text)
        data["counts"] = AnnotationCounts(**data["counts"])
        if "stsb_dev" in data:  # committed before eval.select_by: the score was STS-B dev
            data["score"] = data.pop("stsb_dev")
        return PairVersion(**data)

    def committed(self) -> list[PairVersion]:
        """Every committed version, by step."""
        found = [self._read(directory) for directory in storage.list_dirs(self.root)]
        return sorted((v for v in found if v is not None), key=lambda version: version.step)

    def get(self, step: int) -> PairVersion | None:
        return self._read(self.location(step))

    def discard_except(self, step: int) -> None:
        """Delete every other version, and the mining model of `step`'s: only its pairs are
        read from now on."""
        for directory in storage.list_dirs(self.root):
            if directory != self.location(step):
                storage.delete_tree(directory)
        storage.delete_tree(storage.join(self.location(step), "model"))


class CheckpointFeed(UserCallback):
    """Ray Train callback, run in the Train controller: each checkpoint that every worker has
    reported (and that is on storage) goes to `queue` (a `ray.util.queue.Queue`) as a
    :class:`Report`, before Ray Train's `fit` returns."""

    def __init__(self, queue) -> None:
        self.queue = queue

    def after_report(self, run_context, metrics, checkpoint) -> None:
        if checkpoint is None or not metrics or SELECT_METRIC not in metrics[0]:
            return
        first = metrics[0]  # every rank reports the same step and (broadcast) scores
        self.queue.put(Report(int(first["step"]), float(first[SELECT_METRIC]), checkpoint))


Miner = Callable[[Report, str], tuple[str, AnnotationCounts]]


class NextRoundAnnotator:
    """A driver thread that mines the next round's pairs while this round trains.

    `poll()` returns the reports that arrived since the last call (from :class:`CheckpointFeed`);
    `mine(report, directory)` exports the report's checkpoint and annotates with it into
    `directory`, returning (pairs directory, counts). One annotation runs at a time. Call
    :meth:`finish` once training ended (it returns the version the next round trains on) or
    :meth:`close` to stop without one.
    """

    def __init__(
        self,
        versions: PairVersions,
        poll: Callable[[], list],
        mine: Miner,
        worth_mining: Callable[[Report], bool] = lambda report: True,
        poll_s: float = 0.5,
    ) -> None:
        self.versions, self._poll, self._mine, self._poll_s = versions, poll, mine, poll_s
        # False for a report after which no next round would run (the rounds' stopping rule):
        # its annotation would only take cores from training.
        self._worth_mining = worth_mining
        self._best: Report | None = None  # the best trained report so far
        self._no_new_work = threading.Event()
        self._error: BaseException | None = None
        self._mining: int | None = None  # the step being mined now
        self._thread = threading.Thread(target=self._run, name="next-round-annotator", daemon=True)
        self.feed: CheckpointFeed | None = None  # what reports to `poll` (follow_training)
        self.on_stop: Callable[[], None] | None = None  # releases the feed, once stopped

    def start(self) -> NextRoundAnnotator:
        self._thread.start()
        return self

    def _next(self) -> Report | None:
        """The best trained report so far, when it has no version yet."""
        for report in self._poll():
            if report.step > 0 and (self._best is None or report.score > self._best.score):
                self._best = report
        best = self._best
        if best is None or self.versions.get(best.step) is not None:
            return None
        return best if self._worth_mining(best) else None

    def _run(self) -> None:
        try:
            # The flag is checked before each new annotation: one already running always ends
            # (Ray Data cannot be cancelled from outside) and is committed.
            while not self._no_new_work.is_set():
                target = self._next()
                if target is None:
                    self._no_new_work.wait(self._poll_s)
                else:
                    self._mine_version(target)
        except BaseException as error:  # re-raised by finish(), on the driver's thread
            self._error = error

    def _mine_version(self, report: Report) -> None:
        log.warning("overlap: mining the next round's pairs with step %d (selection score "
                    "%.2f) while training goes on", report.step, report.score)  # fmt: skip
        directory = self.versions.start(report.step)
        started = time.perf_counter()
        self._mining = report.step
        try:
            pairs_dir, counts = self._mine(report, directory)
        finally:
            self._mining = None
        seconds = round(time.perf_counter() - started, 1)
        self.versions.commit(PairVersion(report.step, report.score, pairs_dir, counts, seconds))
        log.warning("overlap: step %d's pairs committed (%d pairs, %.0f s)",
                    report.step, counts.pairs, seconds)  # fmt: skip

    def finish(self, kept_step: int | None) -> PairVersion | None:
        """Training ended and kept `kept_step`: start nothing new, wait for the annotation in
        flight, and return the version mined with `kept_step`, else the freshest version, else
        None (the next round then annotates after training, as sequential rounds do)."""
        self._no_new_work.set()
        self._thread.join()
        self._release()
        if self._error is not None:
            raise RuntimeError("overlapped annotation failed") from self._error
        chosen = self.versions.get(kept_step) if kept_step is not None else None
        if chosen is None:
            committed = self.versions.committed()
            chosen = committed[-1] if committed else None
        return chosen

    def close(self, timeout_s: float | None = None) -> None:
        """Stop without using a version (training failed, or the rounds stop here): nothing
        new starts; an annotation in flight is waited for, at most `timeout_s` seconds."""
        self._no_new_work.set()
        self._thread.join(timeout_s)
        mining = self._mining
        if self._thread.is_alive() and mining is not None:
            log.warning("overlap: step %d's annotation is still running; it is left to finish",
                        mining)  # fmt: skip
        self._release()

    def _release(self) -> None:
        if self.on_stop is not None:
            self.on_stop()
            self.on_stop = None


def follow_training(
    versions: PairVersions, mine: Miner, worth_mining: Callable[[Report], bool]
) -> NextRoundAnnotator:
    """A started :class:`NextRoundAnnotator` fed through a Ray queue (an actor that reserves
    no CPU) by the :class:`CheckpointFeed` in its `feed`, for the training's callbacks."""
    from ray.util.queue import Queue

    queue = Queue(actor_options={"num_cpus": 0})
    annotator = NextRoundAnnotator(
        versions, lambda: queue.get_nowait_batch(queue.qsize()), mine, worth_mining
    )
    annotator.feed = CheckpointFeed(queue)
    annotator.on_stop = queue.shutdown
    return annotator.start()
