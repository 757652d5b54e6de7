"""Annotation that overlaps training (infocse/overlap.py): versioned pairs, which checkpoint is
mined and used, and shutdown. The thread is driven by fake reports and a fake miner here;
tests/infocse/test_rounds.py runs it under Ray Train."""

import json
import threading
from pathlib import Path

import pytest

from distributed_emb.infocse.annotation_tables import AnnotationCounts
from distributed_emb.infocse.overlap import (
    COMMIT_FILE,
    CheckpointFeed,
    NextRoundAnnotator,
    PairVersion,
    PairVersions,
    Report,
)


def _version(versions: PairVersions, step: int, pairs: int = 3) -> PairVersion:
    directory = Path(versions.start(step))
    (directory / "pairs").mkdir()
    return PairVersion(
        step, 80.0 + step, str(directory / "pairs"), AnnotationCounts(pairs=pairs), 1.0
    )


def test_a_version_committed_before_selection_scores_reads_its_sts_as_the_score(tmp_path):
    versions = PairVersions(tmp_path / "v")
    directory = Path(versions.start(7))
    (directory / "COMMIT").write_text(json.dumps({
        "step": 7, "stsb_dev": 81.0, "pairs_dir": str(directory / "pairs"),
        "counts": {"pairs": 3}, "annotate_s": 1.0,
    }))  # fmt: skip
    assert versions.get(7).score == 81.0


def test_a_version_is_read_only_once_committed(tmp_path):
    versions = PairVersions(tmp_path / "v")
    version = _version(versions, 20)
    assert versions.committed() == [] and versions.get(20) is None  # written, not committed
    versions.commit(version)
    assert versions.get(20) == version
    versions.commit(_version(versions, 10))
    assert [v.step for v in versions.committed()] == [10, 20]
    # Starting a step again clears its abandoned directory, COMMIT included.
    versions.start(20)
    assert not (tmp_path / "v" / "step_20" / COMMIT_FILE).exists()
    assert [v.step for v in versions.committed()] == [10]
    # The round adopts one version: the others go, and so does its mining model.
    (tmp_path / "v" / "step_10" / "model").mkdir()
    versions.commit(_version(versions, 30))
    versions.discard_except(10)
    assert [v.step for v in versions.committed()] == [10]
    assert not (tmp_path / "v" / "step_10" / "model").exists()
    assert (tmp_path / "v" / "step_10" / "pairs").is_dir()


class Feed:
    """Reports handed to the annotator's poll, as the Ray queue would."""

    def __init__(self):
        self.items, self.lock = [], threading.Lock()

    def put(self, *reports):
        with self.lock:
            self.items.extend(reports)

    def poll(self):
        with self.lock:
            taken, self.items = self.items, []
        return taken


class Miner:
    """Records which steps it mined; a step in `hold` blocks until released."""

    def __init__(self, hold=(), fail=()):
        self.mined, self.hold, self.fail = [], {s: threading.Event() for s in hold}, set(fail)
        self.started = {s: threading.Event() for s in hold}

    def __call__(self, report, directory: str):
        if report.step in self.started:
            self.started[report.step].set()
            assert self.hold[report.step].wait(30)
        if report.step in self.fail:
            raise OSError(f"disk full at step {report.step}")
        (Path(directory) / "pairs").mkdir()
        self.mined.append(report.step)
        return str(Path(directory) / "pairs"), AnnotationCounts(pairs=report.step)


def _report(step, dev):
    return Report(step, dev, checkpoint=f"ckpt-{step}")


def _annotator(tmp_path, feed, miner):
    return NextRoundAnnotator(PairVersions(tmp_path / "v"), feed.poll, miner, poll_s=0.01).start()


def test_the_best_trained_checkpoint_so_far_is_mined_and_kept_steps_pairs_are_used(tmp_path):
    feed, miner = Feed(), Miner(hold=[20])
    annotator = _annotator(tmp_path, feed, miner)
    feed.put(_report(0, 99.0), _report(20, 70.0))  # step 0 (the start) is never mined
    assert miner.started[20].wait(10)
    # While step 20 is mined: a better step 40, then a worse step 60, then a better step 80.
    feed.put(_report(40, 71.0), _report(60, 60.0), _report(80, 72.0))
    miner.hold[20].set()
    while not annotator.versions.get(80):
        threading.Event().wait(0.01)
    version = annotator.finish(kept_step=80)
    # One at a time: after 20, the best so far (80) was mined; 40 was overtaken, 60 is worse.
    assert miner.mined == [20, 80]
    assert version.step == 80 and version.counts.pairs == 80
    assert annotator.versions.get(20).step == 20  # the earlier version stays, committed


def test_the_kept_step_being_mined_is_waited_for(tmp_path):
    feed, miner = Feed(), Miner(hold=[20])
    annotator = _annotator(tmp_path, feed, miner)
    feed.put(_report(20, 70.0))
    assert miner.started[20].wait(10)
    threading.Timer(0.3, miner.hold[20].set).start()
    version = annotator.finish(kept_step=20)
    assert version.step == 20 and miner.mined == [20]


def test_without_the_kept_steps_pairs_the_freshest_version_is_used(tmp_path):
    feed, miner = Feed(), Miner(hold=[40])
    annotator = _annotator(tmp_path, feed, miner)
    feed.put(_report(20, 70.0))
    while not annotator.versions.get(20):
        threading.Event().wait(0.01)
    feed.put(_report(40, 71.0))
    assert miner.started[40].wait(10)
    miner.hold[40].set()
    # Training kept step 60 (reported last), which nothing mined: the freshest pairs serve.
    version = annotator.finish(kept_step=60)
    assert version.step == 40 and 60 not in miner.mined


def test_nothing_mined_means_no_version(tmp_path):
    annotator = _annotator(tmp_path, Feed(), Miner())
    assert annotator.finish(kept_step=20) is None


def test_close_does_not_wait_for_the_annotation_in_flight_and_starts_nothing_new(tmp_path):
    feed, miner = Feed(), Miner(hold=[20])
    stopped = []
    annotator = _annotator(tmp_path, feed, miner)
    annotator.on_stop = lambda: stopped.append(True)
    feed.put(_report(20, 70.0))
    assert miner.started[20].wait(10)
    feed.put(_report(40, 75.0))
    annotator.close(timeout_s=0)  # returns at once, the feed released
    assert stopped == [True]
    miner.hold[20].set()
    annotator._thread.join(10)
    assert not annotator._thread.is_alive()
    assert miner.mined == [20]  # the one in flight ended; the better step 40 never started
    annotator.close()
    assert stopped == [True]  # released once


def test_a_failed_annotation_leaves_no_version_and_finish_raises(tmp_path):
    feed, miner = Feed(), Miner(fail=[20])
    annotator = _annotator(tmp_path, feed, miner)
    feed.put(_report(20, 70.0))
    with pytest.raises(RuntimeError, match="overlapped annotation failed") as raised:
        while annotator._thread.is_alive():
            threading.Event().wait(0.01)
        annotator.finish(kept_step=20)
    assert "disk full" in str(raised.value.__cause__)
    assert annotator.versions.committed() == []


class Queue:
    def __init__(self):
        self.items = []

    def put(self, item):
        self.items.append(item)


def test_the_feed_sends_each_registered_checkpoint_with_its_step_and_selection_score():
    """The score is eval.select_by's (select_score): here a retrieval split's, not STS-B dev."""
    queue = Queue()
    feed = CheckpointFeed(queue)
    scored = {"step": 20, "stsb_dev_spearman": 71.5, "select_score": 33.0}
    feed.after_report(None, [scored] * 2, checkpoint="ckpt")
    feed.after_report(None, [{"step": 21, "loss": 0.1}] * 2, checkpoint="ckpt")  # no dev score
    feed.after_report(None, [{**scored, "step": 22}] * 2, checkpoint=None)
    assert queue.items == [Report(20, 33.0, "ckpt")]


def test_a_report_after_which_no_next_round_would_run_is_not_mined(tmp_path):
    feed, miner = Feed(), Miner()
    annotator = NextRoundAnnotator(
        PairVersions(tmp_path / "v"), feed.poll, miner,
        worth_mining=lambda report: report.score > 75.0, poll_s=0.01,
    ).start()  # fmt: skip
    feed.put(_report(20, 70.0))
    feed.put(_report(40, 80.0))
    while not annotator.versions.get(40):
        threading.Event().wait(0.01)
    assert annotator.finish(kept_step=40).step == 40
    assert miner.mined == [40]
