"""Where a run's numbers go: the metrics sinks (plots: plots.py; the console: console.py).

Sinks, all written by rank 0 of the Ray Train worker group (`logging` section of the config):

- `<output.dir>/train_log.jsonl`: always; one JSON object per logged step or evaluation.
- TensorBoard event files in `<output.dir>/tensorboard/` (`logging.tensorboard`, default on):
  tensorboardX, which Ray Train already depends on, else torch.utils.tensorboard.
- Weights & Biases and MLflow (`logging.wandb`, `logging.mlflow`), through Ray's own
  `setup_wandb` / `setup_mlflow`.

An optional sink that cannot start (package missing, no API key, server unreachable) or that
fails later says so in one line and is dropped: tracking never stops training.

With `output.storage_path` set, the run's log files also live beside its checkpoints,
`<storage>/<run name>/logs/` (`StoredLogs`): rank 0 uploads run.log, train_log.jsonl and the
TensorBoard files at every report and at the end, the driver its own lines while it waits;
`<output.dir>` on each node is a local copy that may die with its node.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import math
import os
import re
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from distributed_emb.config import to_dict
from distributed_emb.console import LOG_FORMAT
from distributed_emb.settings import flatten
from distributed_emb.storage import (
    copy_to_storage,
    is_remote,
    join,
    list_files,
    read_bytes,
    read_text,
    write_bytes,
    write_text,
)

log = logging.getLogger(__name__)

TRAIN_LOG = "train_log.jsonl"
TENSORBOARD_DIR = "tensorboard"


# ---------------------------------------------------------------------------------------------
# Metrics sinks
# ---------------------------------------------------------------------------------------------


class JsonlSink:
    """`train_log.jsonl`: each record a line, opened in append mode per line (a resumed run
    adds to it; a crash loses at most the line being written)."""

    name = "train_log.jsonl"

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def log(self, step: int, metrics: dict[str, float], kind: str) -> None:
        row = {"kind": kind, "step": step, "time": round(time.time(), 3), **metrics}
        with self.path.open("a") as handle:
            handle.write(json.dumps(row, default=_json_default) + "\n")

    def close(self) -> None:
        pass


class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, log_dir: str | os.PathLike):
        try:
            from tensorboardX import SummaryWriter  # optional
        except ImportError:
            try:
                from torch.utils.tensorboard import SummaryWriter  # optional
            except ImportError as error:
                raise ImportError(
                    "neither tensorboardX nor tensorboard is installed (pip install tensorboardX)"
                ) from error
        self.writer = SummaryWriter(str(log_dir))

    def log(self, step: int, metrics: dict[str, float], kind: str) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(f"{kind}/{key}", value, step)
        self.writer.flush()  # watchable while the run goes on

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    name = "wandb"

    def __init__(self, config: dict, run_name: str | None):
        from ray.air.integrations.wandb import setup_wandb  # optional

        self.run = setup_wandb(
            config=config,
            project=os.environ.get("WANDB_PROJECT", "distributed_emb"),
            name=run_name,
            rank_zero_only=False,  # only rank 0 builds sinks at all
        )

    def log(self, step: int, metrics: dict[str, float], kind: str) -> None:
        self.run.log({f"{kind}/{key}": value for key, value in metrics.items()}, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowSink:
    name = "mlflow"

    def __init__(self, config: dict, run_name: str | None, output_dir: Path):
        from ray.air.integrations.mlflow import setup_mlflow  # optional

        # No server configured: a file store beside the run's other outputs, not ./mlruns in
        # whatever directory the Ray worker happens to run in.
        uri = os.environ.get("MLFLOW_TRACKING_URI") or (output_dir / "mlruns").resolve().as_uri()
        self.mlflow = setup_mlflow(
            config=flatten(config),
            tracking_uri=uri,
            experiment_name=os.environ.get("MLFLOW_EXPERIMENT_NAME", "distributed_emb"),
            run_name=run_name,
            rank_zero_only=False,
        )

    def log(self, step: int, metrics: dict[str, float], kind: str) -> None:
        self.mlflow.log_metrics({f"{kind}/{k}": v for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


class MetricsSinks:
    """Fan-out to every sink that started; a sink that raises is dropped with one line."""

    def __init__(self, sinks: list):
        self.sinks = sinks

    @classmethod
    def open(cls, config, output_dir: str | os.PathLike) -> MetricsSinks:
        """The sinks a training config's `logging` section asks for, in `output_dir` (rank 0
        only)."""

        return cls.start(config.logging, output_dir, to_dict(config), config.output.run_name)

    @classmethod
    def start(
        cls,
        settings,
        output_dir: str | os.PathLike,
        params: dict,
        run_name: str | None,
        log_name: str = TRAIN_LOG,
        key: str = "logging",
    ) -> MetricsSinks:
        """The sinks `settings` (a LoggingConfig) asks for, writing into `output_dir`: the
        JSONL file `log_name`, always, and `tensorboard/`, W&B, MLflow when asked. `params`:
        the run's config as a dict (W&B config, MLflow params); `key`: the config section's
        name in messages."""
        output = Path(output_dir)
        sinks: list = [JsonlSink(output / log_name)]
        wanted = [
            (settings.tensorboard, f"{key}.tensorboard", None,  # tensorboardX or tensorboard
             lambda: TensorBoardSink(output / TENSORBOARD_DIR)),
            (settings.wandb, f"{key}.wandb", "wandb", lambda: WandbSink(params, run_name)),
            (settings.mlflow, f"{key}.mlflow", "mlflow",
             lambda: MlflowSink(params, run_name, output)),
        ]  # fmt: skip
        for enabled, key, package, start in wanted:
            if enabled:
                sink = _start_sink(start, key, package)
                if sink is not None:
                    sinks.append(sink)
        return cls(sinks)

    def log(self, step: int, metrics: dict[str, Any], kind: str = "train") -> None:
        # Numbers only (a flag such as "final" is not a curve); `step` is the row's own.
        numbers = {k: v for k, v in metrics.items() if is_number(v) and k != "step"}
        for sink in list(self.sinks):
            try:
                sink.log(step, numbers, kind)
            except Exception as error:  # noqa: BLE001 - a tracking failure never stops training
                log.warning("%s stopped logging (dropped for this run): %s", sink.name, error)
                self.sinks.remove(sink)

    def close(self) -> None:
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as error:  # noqa: BLE001
                log.warning("%s did not close cleanly: %s", sink.name, error)
        self.sinks = []


def _start_sink(start, key: str, package: str | None):
    # Ray's setup_wandb/setup_mlflow import their package at import time and raise a
    # RuntimeError later: ask for the package first, for one plain message.
    if package is not None and importlib.util.find_spec(package) is None:
        log.warning(
            "%s: %s is not installed (pip install %s); training goes on without it",
            key, package, package,
        )  # fmt: skip
        return None
    try:
        return start()
    except Exception as error:  # noqa: BLE001 - no API key, server unreachable, ...
        log.warning(
            "%s: could not start (%s: %s); training goes on without it",
            key, type(error).__name__, _one_line(error),
        )  # fmt: skip
    return None


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= 300 else text[:297] + "..."


def is_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value)


def _json_default(value: Any):
    return float(value) if hasattr(value, "__float__") else str(value)


def read_train_log(location: str | os.PathLike) -> list[dict]:
    """The rows of a train_log.jsonl (a local path, or a file on object storage: a run's
    `logs/train_log.jsonl`); a resumed run's repeated steps keep their last row, and a torn
    last line (a crash mid-write) is skipped."""
    text = read_text(location)
    if text is None:
        return []
    rows: dict[tuple[str, int], dict] = {}
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "step" in row:
            rows[(row.get("kind", "train"), row["step"])] = row
    return sorted(rows.values(), key=lambda row: (row["step"], row.get("kind", "")))


# ---------------------------------------------------------------------------------------------
# The run's logs on its storage path
# ---------------------------------------------------------------------------------------------

LOGS_DIR = "logs"  # <output.storage_path>/<run name>/logs/
RUN_LOG = "run.log"
LOG_PARTS = "parts"  # logs/parts/<role>-<start>-<pid>-<random>.log: one process's lines
# LOG_FORMAT's asctime ("2025-01-31 12:00:00,123 "): a line that starts with one starts a record.
_RECORD_START = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3} ")


class RecordedLines(logging.Handler):
    """This process's log records, formatted as run.log has them, kept in memory: what it
    uploads as its part of the run's run.log."""

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter(LOG_FORMAT))
        self.lines: list[str] = []
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:  # noqa: BLE001 - as logging's own handlers: never raise from a log call
            self.handleError(record)
            return
        with self._guard:
            self.lines.append(text + "\n")

    def text(self) -> str:
        with self._guard:
            return "".join(self.lines)


def merge_run_logs(texts: list[str]) -> str:
    """One run.log from several processes' lines (the driver's and each rank 0's, across
    attempts): records in time order, a record that several parts hold once (a driver's log
    file that also holds rank 0's lines, on one machine). A record is a line with a timestamp
    and the lines after it without one (a traceback)."""
    records: list[str] = []
    for text in texts:
        current: list[str] = []
        for line in text.splitlines(keepends=True):
            if _RECORD_START.match(line) and current:
                records.append("".join(current))
                current = []
            current.append(line if line.endswith("\n") else line + "\n")
        if current:
            records.append("".join(current))
    unique = list(dict.fromkeys(records))
    return "".join(sorted(unique, key=lambda record: record[:23]))  # stable: ties keep order


class StoredLogs:
    """A run's log files on its storage path (`<storage>/<run name>/logs/`), so that they
    outlive the node that wrote them: `run.log` (the driver's and rank 0's lines, every
    attempt's, in time order), `train_log.jsonl` and `tensorboard/`.

    Each process that logs (the driver; rank 0 of each worker group) keeps its own lines in
    memory and uploads them as its part (`logs/parts/`), then writes `run.log` again as the
    merge of every part there. Rank 0 first continues the stored `train_log.jsonl` (a new node,
    or a deleted output directory, starts from what storage holds), then uploads it and the
    TensorBoard event files whole at each `upload`. Writes are whole-file PUTs: a reader sees
    an older version or a newer one, never half a file."""

    def __init__(
        self,
        location: str,
        role: str,
        logger: logging.Logger,
        output_dir: str | os.PathLike | None = None,
    ):
        """`location`: `<storage>/<run name>/logs`. `role`: "driver" or "rank0" (the part's
        name). `logger`: whose records are this process's lines. `output_dir`: where this
        process writes train_log.jsonl and tensorboard/ (rank 0), or None (the driver)."""
        self.location = location
        stamp = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{secrets.token_hex(3)}"
        self.part = f"{role}-{stamp}.log"
        self.output = Path(output_dir) if output_dir is not None else None
        self.lines = RecordedLines()
        self.logger = logger
        # One per logger and process: a run that failed before close() left its handler.
        for handler in [h for h in logger.handlers if isinstance(h, RecordedLines)]:
            logger.removeHandler(handler)
        logger.addHandler(self.lines)

    def continue_stored(self) -> None:
        """Make the local train_log.jsonl continue the stored one: a local file that is not
        an extension of it (absent: another node, a deleted directory) is replaced by it."""
        if self.output is None:
            return
        stored = read_bytes(join(self.location, TRAIN_LOG))
        local = self.output / TRAIN_LOG
        if stored is None or (local.is_file() and local.read_bytes().startswith(stored)):
            return
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(stored)

    def upload(self) -> None:
        """This process's lines, the merged run.log and (rank 0) train_log.jsonl and the
        TensorBoard files, written to storage now. A failure is one line: the run goes on."""
        try:
            self._upload()
        except Exception as error:  # noqa: BLE001 - storage trouble never stops training
            log.warning("could not write the run's logs to %s: %s", self.location, _one_line(error))

    def _upload(self) -> None:
        parts = join(self.location, LOG_PARTS)
        write_text(join(parts, self.part), self.lines.text())
        if self.output is not None:
            train_log = self.output / TRAIN_LOG
            if train_log.is_file():
                write_bytes(join(self.location, TRAIN_LOG), train_log.read_bytes())
            events = self.output / TENSORBOARD_DIR
            if events.is_dir() and any(events.iterdir()):
                copy_to_storage(events, join(self.location, TENSORBOARD_DIR))
        texts = [read_text(part) or "" for part in list_files(parts)]
        write_text(join(self.location, RUN_LOG), merge_run_logs(texts))

    def close(self) -> None:
        """The last upload; the handler leaves the logger."""
        self.upload()
        self.logger.removeHandler(self.lines)

    @contextlib.contextmanager
    def every(self, seconds: float) -> Iterator[None]:
        """Upload now, every `seconds` in a background thread while the block runs (the
        driver, waiting in trainer.fit: its lines are on storage if the job is killed), and
        once more at its end."""
        done = threading.Event()

        def loop() -> None:
            while not done.wait(seconds):
                self.upload()

        self.upload()
        thread = threading.Thread(target=loop, name="stored-logs", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
            self.upload()


# While a job that runs in its driver (MCR², embed, mine) works, its lines and curves reach
# storage this often: a job killed mid-run leaves what it logged up to then.
OUTPUT_UPLOAD_S = 30.0


@contextlib.contextmanager
def logs_on_storage(location: str | None) -> Iterator[None]:
    """For a job that writes its output straight to object storage (the embed job's or
    mining's `s3://…` output): its log lines at `<location>/logs/run.log`, every
    OUTPUT_UPLOAD_S while it runs and when it ends, where a local output would hold run.log."""
    if not location or not is_remote(location):
        yield
        return
    stored = StoredLogs(join(location, LOGS_DIR), "driver", logging.getLogger())
    try:
        with stored.every(OUTPUT_UPLOAD_S):
            yield
    finally:
        stored.close()


@contextlib.contextmanager
def outputs_on_storage(
    storage_path: str | None, run_name: str, output_dir: str | os.PathLike
) -> Iterator[str | None]:
    """For a job whose work runs in its driver: with `storage_path` set, its run.log lines,
    train_log.jsonl and TensorBoard files reach `<storage>/<run name>/logs/` while it runs
    (StoredLogs, every OUTPUT_UPLOAD_S), and when it ends, finished or failed, every file of
    `output_dir` is copied to `<storage>/<run name>/`, so that nothing the user needs stays on
    the node. Yields `<storage>/<run name>`, or None (no storage: the local files only)."""
    if not storage_path:
        yield None
        return
    location = join(storage_path.rstrip("/"), run_name)
    stored = StoredLogs(join(location, LOGS_DIR), "driver", logging.getLogger(), output_dir)
    try:
        with stored.every(OUTPUT_UPLOAD_S):
            yield location
    finally:
        stored.close()
        copy_to_storage(output_dir, location)
