"""Progress windows: what the loop's throughput numbers count, and what the hot loop avoids."""

import os
import time

import pytest
import torch

from distributed_emb.config import TrainingConfig, load_config
from distributed_emb.train.loop import _timed, peak_rss_mb, worker_threads
from distributed_emb.train.progress import ProgressLog


def test_record_keeps_metric_sums_on_their_device():
    # A meta tensor cannot be copied to the host: any .cpu()/.item() in record() would raise.
    progress = ProgressLog(total_steps=10, global_batch=8, enabled=False)
    loss = torch.tensor(1.0, device="meta")
    progress.record({"loss": loss}, 1e-5, 8, 0.1, torch.tensor(100, device="meta"), 0.0)
    progress.record({"loss": loss}, 1e-5, 8, 0.1, torch.tensor(100, device="meta"), 0.0)
    assert progress.sums["loss"].device.type == "meta"
    assert progress.steps == 2


def test_window_counts_steps_and_waits_but_not_evaluation_time():
    progress = ProgressLog(total_steps=10, global_batch=8, enabled=False)
    time.sleep(0.05)  # training time: counted
    progress.record({"loss": torch.tensor(2.0)}, 1e-5, 8, 0.02, torch.tensor(60), 0.01)
    progress.record({"loss": torch.tensor(4.0)}, 1e-5, 8, 0.02, torch.tensor(40), 0.03)
    window = progress.window_means()
    assert window["loss"] == pytest.approx(3.0)
    assert window["window_steps"] == 2 and window["data_wait_s"] == pytest.approx(0.04)
    assert window["sentences_per_s"] == pytest.approx(16 / window["window_s"])
    assert window["tokens_per_s"] == pytest.approx(100 / window["window_s"])
    assert window["window_s"] >= 0.05

    time.sleep(0.2)  # evaluation + checkpoint: between window_means and restart_clock
    progress.restart_clock()
    progress.record({"loss": torch.tensor(1.0)}, 1e-5, 8, 0.001, 10, 0.0)
    assert progress.window_means()["window_s"] < 0.2
    assert progress.window_means() == {}  # an empty window reports nothing


def test_timed_measures_the_wait_for_each_item():
    def slow():
        for i in range(3):
            time.sleep(0.03 * i)
            yield i

    items = list(_timed(slow()))
    assert [item for item, _ in items] == [0, 1, 2]
    assert items[2][1] >= 0.06 and items[0][1] < 0.03


@pytest.mark.parametrize(
    ("cpus", "threads", "expected"), [(1, None, 1), (0.5, None, 1), (2.5, None, 3), (2, 3, 3)]
)
def test_worker_threads_round_cpus_up_unless_set(cpus, threads, expected):
    overrides = [f"train.cpus_per_worker={cpus}"]
    if threads is not None:
        overrides.append(f"train.torch_threads={threads}")
    assert worker_threads(load_config(TrainingConfig, None, overrides)) == expected


def test_peak_rss_is_this_process_high_water_mark():
    pages = int(open("/proc/self/statm").read().split()[1])
    current = pages * os.sysconf("SC_PAGE_SIZE") / 2**20  # MiB resident now
    block = torch.ones(256 * 2**20 // 4)  # 256 MiB, written, so resident
    assert peak_rss_mb() >= current + 200
    del block
    assert peak_rss_mb() >= current + 200  # a high-water mark does not come down
