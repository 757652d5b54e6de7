"""Progress windows: what the loop's throughput numbers count, and what the hot loop avoids."""

import logging
import os
import sys

import pytest
import torch

from distributed_emb.config import TrainingConfig, load_config
from distributed_emb.train.progress import ProgressLog, resolve_progress_bar, show_progress_bar
from distributed_emb.train.worker import _timed, peak_rss_mb, worker_threads


class _Clock:
    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def test_record_keeps_metric_sums_on_their_device():
    # A meta tensor cannot be copied to the host: any .cpu()/.item() in record() would raise.
    progress = ProgressLog(total_steps=10, global_batch=8, enabled=False)
    loss = torch.tensor(1.0, device="meta")
    progress.record({"loss": loss}, 1e-5, 8, 0.1, torch.tensor(100, device="meta"), 0.0)
    progress.record({"loss": loss}, 1e-5, 8, 0.1, torch.tensor(100, device="meta"), 0.0)
    assert progress.sums["loss"].device.type == "meta"
    assert progress.steps == 2


def test_window_counts_steps_and_waits_but_not_evaluation_time(monkeypatch):
    from distributed_emb.train import progress as progress_module

    clock = _Clock()  # a fake clock: no sleeps, no timed assertions
    monkeypatch.setattr(progress_module, "time", clock)
    progress = ProgressLog(total_steps=10, global_batch=8, enabled=False)
    clock.now += 0.05  # training time: counted
    progress.record({"loss": torch.tensor(2.0)}, 1e-5, 8, 0.02, torch.tensor(60), 0.01)
    progress.record({"loss": torch.tensor(4.0)}, 1e-5, 8, 0.02, torch.tensor(40), 0.03)
    window = progress.window_means()
    assert window["loss"] == pytest.approx(3.0)
    assert window["window_steps"] == 2 and window["data_wait_s"] == pytest.approx(0.04)
    assert window["window_s"] == pytest.approx(0.05)
    assert window["sentences_per_s"] == pytest.approx(16 / 0.05)
    assert window["tokens_per_s"] == pytest.approx(100 / 0.05)

    clock.now += 0.2  # evaluation + checkpoint: between window_means and restart_clock
    progress.restart_clock()
    clock.now += 0.01
    progress.record({"loss": torch.tensor(1.0)}, 1e-5, 8, 0.001, 10, 0.0)
    assert progress.window_means()["window_s"] == pytest.approx(0.01)
    assert progress.window_means() == {}  # an empty window reports nothing


def test_timed_measures_the_wait_for_each_item(monkeypatch):
    from distributed_emb.train import worker as worker_module

    clock = _Clock()
    monkeypatch.setattr(worker_module, "time", clock)

    def slow():
        for i in range(3):
            clock.now += 0.03 * i  # producing item i takes 0.03 × i seconds
            yield i

    items = list(_timed(slow()))
    assert [item for item, _ in items] == [0, 1, 2]
    assert [wait for _, wait in items] == pytest.approx([0.0, 0.03, 0.06])


@pytest.mark.parametrize(
    ("cpus", "threads", "expected"), [(1, None, 1), (0.5, None, 1), (2.5, None, 3), (2, 3, 3)]
)
def test_worker_threads_round_cpus_up_unless_set(cpus, threads, expected):
    overrides = [f"train.cpus_per_worker={cpus}"]
    if threads is not None:
        overrides.append(f"train.torch_threads={threads}")
    assert worker_threads(load_config(TrainingConfig, None, overrides).train) == expected


def test_peak_rss_is_this_process_high_water_mark():
    pages = int(open("/proc/self/statm").read().split()[1])
    current = pages * os.sysconf("SC_PAGE_SIZE") / 2**20  # MiB resident now
    block = torch.ones(256 * 2**20 // 4)  # 256 MiB, written, so resident
    assert peak_rss_mb() >= current + 200
    del block
    assert peak_rss_mb() >= current + 200  # a high-water mark does not come down


# ---------------------------------------------------------------------------------------------
# Where the lines go: console, run.log, train_log.jsonl (issue: watchable runs)
# ---------------------------------------------------------------------------------------------


def _steps(progress, count, reconstruction=2e-5):
    for _ in range(count):
        metrics = {"loss": torch.tensor(1.5), "loss_reconstruction": torch.tensor(reconstruction)}
        progress.record(metrics, 1e-5, 8, 0.01, torch.tensor(40), 0.0)


def test_lines_every_logging_steps_reach_run_log_and_train_log(tmp_path):
    from distributed_emb.tracking import JsonlSink, MetricsSinks, read_train_log

    run_log = tmp_path / "run.log"
    run_log.write_text("2026-01-01 00:00:00,000 INFO distributed_emb.data.corpus: driver line\n")
    sinks = MetricsSinks([JsonlSink(tmp_path / "train_log.jsonl")])
    progress = ProgressLog(5, 8, enabled=True, log_every=2, output_dir=tmp_path, sinks=sinks)
    _steps(progress, 5)
    progress.print_eval(5, 81.234, {"stsb_dev_spearman": 81.234, "step": 5, "final": True})
    progress.close()
    logging.getLogger("distributed_emb.train").warning("after close: not in run.log")

    lines = run_log.read_text().splitlines()
    assert lines[0].endswith("driver line")  # appended to, never truncated
    steps = [line.split(": ", 1)[1] for line in lines[1:]]
    # Every `log_every` steps and the last one; losses in scientific notation (the
    # reconstruction term of ~1e-5 used to print as 0.0000).
    assert [s.split(" ")[1] for s in steps] == ["2/5", "4/5", "5/5", "5/5"]
    assert steps[0].startswith("step 2/5 loss=1.500e+00 reconstruction=2.000e-05 lr=1.00e-05 ")
    assert steps[3] == "step 5/5 STS-B dev Spearman 81.23"
    assert " WARNING distributed_emb.train: step 2/5" in lines[1]  # the driver's format
    rows = read_train_log(tmp_path / "train_log.jsonl")
    assert [(r["kind"], r["step"]) for r in rows] == [
        ("train", 2),
        ("train", 4),
        ("eval", 5),
        ("train", 5),
    ]
    assert rows[0]["loss_reconstruction"] == pytest.approx(2e-5)
    assert rows[2]["stsb_dev_spearman"] == pytest.approx(81.234)
    handlers = logging.getLogger("distributed_emb").handlers  # close() took its own away
    assert not any(getattr(h, "baseFilename", None) == str(run_log) for h in handlers)


def test_line_throughput_leaves_out_evaluation_time(monkeypatch):
    from distributed_emb.train import progress as progress_module

    clock = _Clock()
    monkeypatch.setattr(progress_module, "time", clock)
    progress = ProgressLog(total_steps=100, global_batch=8, enabled=False, log_every=4)
    for _ in range(2):
        clock.now += 1.0
        progress.record({"loss": torch.tensor(1.0)}, 1e-5, 8, 0.5, 10, 0.0)
    progress.window_means()  # an evaluation starts
    clock.now += 10.0  # evaluation + checkpoint
    progress.restart_clock()
    for _ in range(2):
        clock.now += 1.0
        progress.record({"loss": torch.tensor(3.0)}, 1e-5, 8, 0.5, 10, 0.0)
    line = progress.line_means()
    # 4 steps × 8 sentences in 4 s of training (14 s of wall time, 10 of them evaluating).
    assert line["sentences_per_s"] == pytest.approx(8.0)
    assert line["tokens_per_s"] == pytest.approx(10.0)
    assert line["loss"] == pytest.approx(2.0)  # the line's own steps, across the evaluation


def test_worker_progress_writes_only_on_rank_0(tmp_path):
    config = load_config(
        TrainingConfig, None, [f"output.dir={tmp_path / 'out'}", "logging.logging_steps=1"]
    )
    silent = ProgressLog.for_worker(config, total_steps=3, rank=1)
    _steps(silent, 1)
    silent.close()
    assert not (tmp_path / "out").exists()

    progress = ProgressLog.for_worker(config, total_steps=3, rank=0, start_step=1)
    assert progress.log_every == 1 and progress.global_batch == 64
    _steps(progress, 2)
    progress.close()
    out = tmp_path / "out"
    log_lines = (out / "run.log").read_text().splitlines()
    assert [line.split(": ", 1)[1].split(" ")[1] for line in log_lines] == ["2/3", "3/3"]
    assert len((out / "train_log.jsonl").read_text().splitlines()) == 2
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))


class _Console:
    def __init__(self, tty: bool):
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


@pytest.mark.parametrize("tty, expected", [(True, "on"), (False, "off")])
def test_the_drivers_console_decides_the_progress_bar(monkeypatch, tmp_path, tty, expected):
    """A bar redrawn into a log file becomes one line per redraw: with the console redirected
    (auto), rank 0 prints only its progress lines; a terminal gets the bar."""
    config = load_config(TrainingConfig, None, [f"output.dir={tmp_path / 'out'}"])
    assert config.logging.progress_bar == "auto"
    monkeypatch.setattr(sys, "stderr", _Console(tty))
    resolve_progress_bar(config)
    assert config.logging.progress_bar == expected
    assert show_progress_bar(config.logging.progress_bar) is tty
    # The workers' own stderr (a file) no longer matters once the driver has resolved it.
    monkeypatch.setattr(sys, "stderr", _Console(not tty))
    assert show_progress_bar(config.logging.progress_bar) is tty


def test_no_bar_when_off_but_every_progress_line(tmp_path):
    config = load_config(
        TrainingConfig,
        None,
        [f"output.dir={tmp_path / 'out'}", "logging.logging_steps=1", "logging.progress_bar=off"],
    )
    progress = ProgressLog.for_worker(config, total_steps=2, rank=0)
    assert progress.bar is None
    _steps(progress, 2)
    progress.close()
    assert len((tmp_path / "out" / "run.log").read_text().splitlines()) == 2
