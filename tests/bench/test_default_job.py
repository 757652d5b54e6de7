"""bench/default_job.py reads the job's speed from its own train_log.jsonl."""

from __future__ import annotations

import json

import pytest

from bench.default_job import job_tokens_per_s


def _write(path, lines):
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def _train(step, sentences_per_s, tokens_per_s):
    return {
        "kind": "train",
        "step": step,
        "sentences_per_s": sentences_per_s,
        "tokens_per_s": tokens_per_s,
    }


def test_job_speed_leaves_out_the_first_interval_and_weights_by_wall_time(tmp_path):
    log = tmp_path / "train_log.jsonl"
    _write(
        log,
        [
            # The step-0 evaluation: its window numbers are not a training interval.
            {"kind": "eval", "step": 0, "global_batch": 64, "tokens_per_s": 1.0},
            _train(2, 10.0, 100.0),  # warm-up interval, left out
            _train(6, 32.0, 2000.0),  # 4 steps × 64 sentences at 32/s: 8 s at 2,000 tokens/s
            _train(8, 16.0, 1000.0),  # 2 steps × 64 sentences at 16/s: 8 s at 1,000 tokens/s
            {"kind": "eval", "step": 8, "global_batch": 64, "tokens_per_s": 5.0},
        ],
    )
    speed = job_tokens_per_s(log)
    assert speed["seconds"] == pytest.approx(16.0)
    assert speed["tokens_per_s"] == pytest.approx(1500.0)
    assert speed["steps"] == 8


def test_a_log_with_only_the_warm_up_interval_is_an_error(tmp_path):
    log = tmp_path / "train_log.jsonl"
    _write(log, [{"kind": "eval", "step": 0, "global_batch": 64}, _train(2, 1.0, 9.0)])
    with pytest.raises(ValueError, match="no training interval"):
        job_tokens_per_s(log)
