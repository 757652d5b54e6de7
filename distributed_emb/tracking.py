"""Where a run's numbers go: the metrics sinks (plots: plots.py; the console: console.py).

Sinks, all written by rank 0 of the Ray Train worker group (`logging` section of the config):

- `<output.dir>/train_log.jsonl`: always; one JSON object per logged step or evaluation.
- TensorBoard event files in `<output.dir>/tensorboard/` (`logging.tensorboard`, default on):
  tensorboardX, which Ray Train already depends on, else torch.utils.tensorboard.
- Weights & Biases and MLflow (`logging.wandb`, `logging.mlflow`), through Ray's own
  `setup_wandb` / `setup_mlflow`.

An optional sink that cannot start (package missing, no API key, server unreachable) or that
fails later says so in one line and is dropped: tracking never stops training.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from distributed_emb.config import to_dict
from distributed_emb.settings import flatten

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


def read_train_log(path: str | os.PathLike) -> list[dict]:
    """The rows of a train_log.jsonl; a resumed run's repeated steps keep their last row, and
    a torn last line (a crash mid-write) is skipped."""
    path = Path(path)
    if not path.is_file():
        return []
    rows: dict[tuple[str, int], dict] = {}
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "step" in row:
            rows[(row.get("kind", "train"), row["step"])] = row
    return sorted(rows.values(), key=lambda row: (row["step"], row.get("kind", "")))
