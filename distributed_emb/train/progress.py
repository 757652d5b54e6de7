"""Rank-0 progress: a bar plus a metrics line every `log_every` steps.

Metrics arrive as tensors and are summed as tensors *on their device*; they become Python
numbers only when a line is printed or a report is made, so the hot loop never waits on the
device (a `.cpu()` per step would be a host/device sync on a GPU).

A window is the training time between two reports: the loop takes its means *before* it
evaluates and restarts the clock *after* the checkpoint is written, so evaluation and
checkpointing never count against training throughput. Within a window the wall time splits
into compute (forward, backward, optimizer), waiting for the next batch (`data_wait_s`) and
the rest (progress bookkeeping, Ray's own work).
"""

from __future__ import annotations

import logging
import time

import torch

log = logging.getLogger("distributed_emb.train")


class ProgressLog:
    def __init__(self, total_steps: int, global_batch: int, enabled: bool, log_every: int = 10):
        self.total_steps = total_steps
        self.global_batch = global_batch
        self.enabled = enabled
        self.log_every = log_every
        self.step = 0
        self._reset_window()
        self.bar = None
        if enabled:
            from ray.experimental.tqdm_ray import tqdm

            self.bar = tqdm(total=total_steps, desc="train", unit="step")

    def _reset_window(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.steps = 0
        self.sentences = 0
        self.seconds = 0.0
        self.data_wait = 0.0
        self.real_tokens = 0
        self.lr = 0.0
        self.window_started = time.perf_counter()

    def record(
        self,
        metrics: dict,
        lr: float,
        sentences: int,
        seconds: float,
        real_tokens,
        data_wait: float = 0.0,
    ) -> None:
        """One optimizer step: `seconds` of compute, `data_wait` seconds spent waiting for its
        batches, `real_tokens` (a tensor or int) non-padding tokens embedded."""
        self.step += 1
        for key, value in metrics.items():
            self.sums[key] = self.sums.get(key, 0.0) + value.detach().float()  # stays on device
        self.steps += 1
        self.sentences += sentences
        self.seconds += seconds
        self.data_wait += data_wait
        self.real_tokens += real_tokens
        self.lr = lr
        if self.bar is not None:
            self.bar.update(1)
        if self.enabled and self.step % self.log_every == 0:
            self._print_line(self.peek())

    def peek(self) -> dict[str, float]:
        if self.steps == 0:
            return {}
        means = {key: float(value) / self.steps for key, value in self.sums.items()}
        # Wall time of the window (data waits included): what a user actually gets.
        wall = max(time.perf_counter() - self.window_started, 1e-9)
        means.update(
            lr=self.lr,
            sentences_per_s=self.sentences / wall,
            tokens_per_s=float(self.real_tokens) / wall,
            compute_fraction=min(1.0, self.seconds / wall),
            data_wait_s=self.data_wait,
            window_s=wall,
            window_steps=self.steps,
            global_batch=self.global_batch,
        )
        return means

    def window_means(self) -> dict[str, float]:
        """Means since the last call (for the report at an evaluation), then a new window.
        Call `restart_clock` when the evaluation and checkpoint are done."""
        means = self.peek()
        self._reset_window()
        return means

    def restart_clock(self) -> None:
        """Start the window's wall clock now (after an evaluation and its checkpoint)."""
        self.window_started = time.perf_counter()

    def _print_line(self, means: dict[str, float]) -> None:
        terms = " ".join(
            f"{k.removeprefix('loss_')}={means[k]:.4f}"
            for k in sorted(means)
            if k.startswith("loss")
        )
        log.warning(
            "step %d/%d %s lr=%.2e %.1f sent/s global_batch=%d",
            self.step,
            self.total_steps,
            terms,
            means["lr"],
            means["sentences_per_s"],
            self.global_batch,
        )

    def print_eval(self, step: int, score: float) -> None:
        if self.enabled:
            log.warning("step %d/%d STS-B dev Spearman %.2f", step, self.total_steps, score)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
