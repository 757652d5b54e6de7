"""Rank-0 progress: a bar, plus a metrics line every `logging.logging_steps` steps.

Metrics arrive as tensors and are summed as tensors *on their device*; they become Python
numbers only when a line is printed or a report is made, so the hot loop never waits on the
device (a `.cpu()` per step would be a host/device sync on a GPU).

A window is the training time between two reports: the loop takes its means *before* it
evaluates and restarts the clock *after* the checkpoint is written, so evaluation and
checkpointing never count against training throughput. Within a window the wall time splits
into compute (forward, backward, optimizer), waiting for the next batch (`data_wait_s`) and
the rest (progress bookkeeping, Ray's own work). A logged line reports the means of the steps
since the previous line (its own interval), with evaluation time left out the same way.

Where the lines go (rank 0 only; the other ranks stay silent):
- the console, through the `distributed_emb.train` logger (Ray forwards a worker's stderr to
  the driver);
- `<output.dir>/run.log`: a Train worker is a separate process, so the driver's log file never
  sees its records; rank 0 adds its own append-mode handler for the same file, and the file
  carries the driver's and rank 0's lines in time order (same format). On a cluster rank 0's
  lines land in `<output.dir>/run.log` on *its* node, which may not be the driver's;
- `<output.dir>/train_log.jsonl`, TensorBoard and the optional trackers (distributed_emb.tracking);
- with `output.storage_path`, all of the above on storage too, `<storage>/<run name>/logs/`
  (tracking.StoredLogs): uploaded at every evaluation and at the end, continued by the rank 0
  of a restarted group on whatever node it lands.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import torch
from ray.experimental.tqdm_ray import tqdm

from distributed_emb.console import LOG_FORMAT
from distributed_emb.tracking import MetricsSinks, StoredLogs

log = logging.getLogger("distributed_emb.train")

RUN_LOG = "run.log"
# Rank 0 logs through this logger's tree: its own lines, the loop's, the sinks' start-up notes.
_RUN_LOGGER = "distributed_emb"


class ProgressLog:
    def __init__(
        self,
        total_steps: int,
        global_batch: int,
        enabled: bool,
        log_every: int = 10,
        output_dir: str | Path | None = None,
        sinks: MetricsSinks | None = None,
        start_step: int = 0,
        show_bar: bool = True,
    ):
        """`output_dir`: where rank 0 appends to run.log (None: console only). `sinks`: where
        each logged line and evaluation also goes. `start_step`: a resumed run's step.
        `show_bar`: draw the progress bar (see show_progress_bar)."""
        self.total_steps = total_steps
        self.global_batch = global_batch
        self.enabled = enabled
        self.log_every = log_every
        self.step = start_step
        self._reset_window()
        self._reset_interval()
        self._handlers: list[logging.Handler] = []
        if enabled and output_dir is not None:
            self._handlers = _attach_run_log(Path(output_dir) / RUN_LOG)
        self.sinks = sinks if enabled and sinks is not None else MetricsSinks([])
        self.stored: StoredLogs | None = None  # the run's logs on its storage path (for_worker)
        self.bar = None
        if enabled and show_bar:
            self.bar = tqdm(total=total_steps, desc="train", unit="step")
            if start_step:
                self.bar.update(start_step)

    @classmethod
    def for_worker(
        cls,
        config,
        total_steps: int,
        rank: int,
        start_step: int = 0,
        stored_logs: str | None = None,
    ) -> ProgressLog:
        """Rank 0's logger with run.log and the sinks of `config.logging` in `config.output.dir`
        (an absolute path set by the driver: a relative one would land in the worker's working
        directory); other ranks get a silent one. `stored_logs`: the run's `logs/` on its
        storage path, which rank 0 continues and keeps up to date (None: local files only)."""
        enabled = rank == 0
        output_dir = Path(config.output.dir) if enabled else None
        progress = cls(
            total_steps,
            config.train.global_batch,
            enabled=enabled,
            log_every=config.logging.logging_steps,
            output_dir=output_dir,
            start_step=start_step,
            show_bar=show_progress_bar(config.logging.progress_bar),
        )
        if enabled and stored_logs is not None:
            progress.stored = StoredLogs(
                stored_logs, "rank0", logging.getLogger(_RUN_LOGGER), output_dir
            )
            progress.stored.continue_stored()  # before the JSONL sink appends to it
        if enabled:  # after run.log is attached, so a sink that cannot start says so there too
            progress.sinks = MetricsSinks.open(config, output_dir)
        return progress

    def _reset_window(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.steps = 0
        self.sentences = 0
        self.seconds = 0.0
        self.data_wait = 0.0
        self.real_tokens = 0
        self.lr = 0.0
        self.window_started = time.perf_counter()
        self._paused_at: float | None = None

    def _reset_interval(self) -> None:
        self._line_sums: dict[str, torch.Tensor] = {}
        self._line_steps = 0
        self._line_sentences = 0
        self._line_tokens = 0
        self._line_wait = 0.0
        self._line_started = time.perf_counter()
        self._line_excluded = 0.0  # evaluation/checkpoint time inside this interval

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
            value = value.detach().float()  # stays on device
            self.sums[key] = self.sums.get(key, 0.0) + value
            self._line_sums[key] = self._line_sums.get(key, 0.0) + value
        self.steps += 1
        self.sentences += sentences
        self.seconds += seconds
        self.data_wait += data_wait
        self.real_tokens += real_tokens
        self.lr = lr
        self._line_steps += 1
        self._line_sentences += sentences
        self._line_tokens = self._line_tokens + real_tokens
        self._line_wait += data_wait
        if self.bar is not None:
            self.bar.update(1)
        if self.enabled and (self.step % self.log_every == 0 or self.step == self.total_steps):
            means = self.line_means()
            self._print_line(means)
            self.sinks.log(self.step, means, "train")
            self._reset_interval()

    def line_means(self) -> dict[str, float]:
        """Means over the steps since the last logged line (evaluation time left out)."""
        if self._line_steps == 0:
            return {}
        wall = time.perf_counter() - self._line_started - self._line_excluded
        wall = max(wall, 1e-9)
        means = {key: float(v) / self._line_steps for key, v in self._line_sums.items()}
        means.update(
            lr=self.lr,
            sentences_per_s=self._line_sentences / wall,
            tokens_per_s=float(self._line_tokens) / wall,
            data_wait_s=self._line_wait,
        )
        return means

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
        self._paused_at = time.perf_counter()
        return means

    def restart_clock(self) -> None:
        """Start the window's wall clock now (after an evaluation and its checkpoint)."""
        now = time.perf_counter()
        if self._paused_at is not None:
            self._line_excluded += now - self._paused_at
            self._paused_at = None
        self.window_started = now

    def _print_line(self, means: dict[str, float]) -> None:
        # Scientific notation: the reconstruction term is ~1e-5, which %.4f printed as 0.0000.
        terms = " ".join(
            f"{k.removeprefix('loss_')}={means[k]:.3e}"
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

    def print_eval(self, step: int, score: float, metrics: dict | None = None) -> None:
        """The evaluation line; `metrics` (the loop's report) also goes to the sinks."""
        if self.enabled:
            # eval.retrieval_dir's splits beside it (selection.py names their keys).
            retrieval = "".join(
                f", {key.removesuffix('_ndcg_at_10').replace('_', ' ')} nDCG@10 {value:.2f}"
                for key, value in (metrics or {}).items()
                if key.startswith("retrieval_") and key.endswith("_ndcg_at_10")
            )
            log.warning(
                "step %d/%d STS-B dev Spearman %.2f%s", step, self.total_steps, score, retrieval
            )
            self.sinks.log(step, metrics if metrics is not None else {"stsb_dev_spearman": score},
                           "eval")  # fmt: skip
            if self.stored is not None:  # every evaluation: the logs so far on storage
                self.stored.upload()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.sinks.close()
        if self.stored is not None:
            self.stored.close()
            self.stored = None
        logger = logging.getLogger(_RUN_LOGGER)
        for handler in self._handlers:
            logger.removeHandler(handler)
            handler.close()
        self._handlers = []


def show_progress_bar(setting: str) -> bool:
    """logging.progress_bar → draw the bar? The driver resolves "auto" against its own stderr
    (resolve_progress_bar) before the config reaches the workers, whose stderr is always a
    file; an unresolved "auto" is judged on this process's stderr."""
    if setting == "auto":
        return sys.stderr.isatty()
    return setting == "on"


def resolve_progress_bar(config) -> None:
    """On the driver: "auto" becomes "on" or "off" by whether the console is a terminal."""
    if config.logging.progress_bar == "auto":
        config.logging.progress_bar = "on" if sys.stderr.isatty() else "off"


def _attach_run_log(path: Path) -> list[logging.Handler]:
    """Rank 0's records under `distributed_emb` also appended to `path` (run.log). Returns the
    handlers added, for `close`."""
    logger = logging.getLogger(_RUN_LOGGER)
    resolved = str(path.resolve())
    if any(getattr(h, "baseFilename", None) == resolved for h in logger.handlers):
        return []  # this process already writes there (a second ProgressLog)
    path.parent.mkdir(parents=True, exist_ok=True)
    file_handler = logging.FileHandler(path, mode="a")  # O_APPEND: safe beside the driver's
    file_handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handlers: list[logging.Handler] = [file_handler]
    if not logging.getLogger().handlers:
        # A Ray worker configures no logging: its warnings reach stderr (and so the driver's
        # console) through logging's last-resort handler, which stops being used once any
        # handler is found. Keep the console as it was.
        console = logging.StreamHandler(sys.stderr)
        console.setFormatter(logging.Formatter("%(message)s"))
        handlers.append(console)
    for handler in handlers:
        logger.addHandler(handler)
    return handlers
