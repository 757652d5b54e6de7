"""The learning-rate schedule both engines build (train/optim.py), step by step."""

from __future__ import annotations

import pytest
import torch

from distributed_emb.train.optim import build_optimizer, build_scheduler
from distributed_emb.train.train_config import TrainLoopConfig


def learning_rates(steps: int, **train_settings) -> list[float]:
    train = TrainLoopConfig(learning_rate=1.0, **train_settings)
    optimizer = build_optimizer(torch.nn.Linear(2, 2), train)
    scheduler = build_scheduler(optimizer, steps, train)
    rates = []
    for _ in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


def test_warm_up_then_linear_decay_to_zero():
    # 10 steps, 2 of warm-up: (s + 1) / 2, then (10 - s) / 8.
    expected = [0.5, 1.0] + [(10 - s) / 8 for s in range(2, 10)]
    assert learning_rates(10, warmup_ratio=0.2) == pytest.approx(expected)


@pytest.mark.parametrize("floor", [0.1, 1.0])
def test_the_decay_ends_at_the_minimum_ratio(floor):
    rates = learning_rates(10, warmup_ratio=0.2, min_learning_rate_ratio=floor)
    plain = learning_rates(10, warmup_ratio=0.2)
    assert rates[:2] == pytest.approx(plain[:2])  # the warm-up is unchanged
    assert rates[2:] == pytest.approx([floor + (1 - floor) * p for p in plain[2:]])
    # One step past the schedule's end, the rate is the floor.
    train = TrainLoopConfig(learning_rate=1.0, min_learning_rate_ratio=floor)
    optimizer = build_optimizer(torch.nn.Linear(2, 2), train)
    scheduler = build_scheduler(optimizer, 4, train)
    for _ in range(4):
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(floor)
