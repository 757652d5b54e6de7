"""Watching a run: where the numbers go (metrics sinks), a quiet console, and plots.

Sinks, all written by rank 0 of the Ray Train worker group (`logging` section of the config):

- `<output.dir>/train_log.jsonl`: always; one JSON object per logged step or evaluation.
- TensorBoard event files in `<output.dir>/tensorboard/` (`logging.tensorboard`, default on):
  tensorboardX, which Ray Train already depends on, else torch.utils.tensorboard.
- Weights & Biases and MLflow (`logging.wandb`, `logging.mlflow`), through Ray's own
  `setup_wandb` / `setup_mlflow`.

An optional sink that cannot start (package missing, no API key, server unreachable) or that
fails later says so in one line and is dropped: tracking never stops training.

The console: Ray Data's progress bars are turned off (our own bar and step lines say the same),
and a warning that Ray repeats every few seconds is said once and then counted.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distributed_emb.config import to_dict

log = logging.getLogger(__name__)

# runtime.setup_logging's format; rank 0's run.log lines use it too, so the file reads as one.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
TRAIN_LOG = "train_log.jsonl"
TENSORBOARD_DIR = "tensorboard"
PLOT_FILE = "learning_curves.png"

# Ray Train's detached placement-group cleaner polls the State API every few seconds and warns
# on each failed poll ("Failed to query Ray Train Controller actor state") when the local Ray
# runs without a dashboard: the same line for the whole run.
REPEATING_RAY_LOGGERS = ("ray.train.v2._internal.execution.controller.placement_group_cleaner",)


# ---------------------------------------------------------------------------------------------
# Quiet console
# ---------------------------------------------------------------------------------------------


class RepeatFilter(logging.Filter):
    """Lets a message through the first time, then counts its repeats and lets one through,
    marked with the count, at the 10th, 100th, 1000th... (a stuck condition stays visible
    without filling the console). Messages are told apart by logger, level and text."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[tuple[str, int, str], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, record.getMessage())
        seen = self.counts.get(key, 0) + 1
        self.counts[key] = seen
        if seen == 1:
            return True
        if seen >= 10 and math.log10(seen).is_integer():
            record.msg = f"{key[2]} [said {seen} times so far; repeats are counted, not shown]"
            record.args = None
            return True
        return False


def dedupe_repeated_ray_warnings(loggers: Iterable[str] = REPEATING_RAY_LOGGERS) -> None:
    """Install one RepeatFilter on each of these loggers (idempotent)."""
    for name in loggers:
        target = logging.getLogger(name)
        if not any(isinstance(f, RepeatFilter) for f in target.filters):
            target.addFilter(RepeatFilter())


def quiet_ray_data() -> None:
    """No Ray Data progress bars in this process (and in the Ray Data executors of datasets
    built after this call: the context travels with the dataset)."""
    from ray.data import DataContext  # startup

    context = DataContext.get_current()
    context.enable_progress_bars = False
    context.enable_operator_progress_bars = False


def quiet_worker_setup() -> None:
    """Ray's `worker_process_setup_hook` (see runtime.start_ray): runs in every worker process of
    the job, including Ray Train's detached placement-group cleaner, where the repeated
    warning is logged."""
    dedupe_repeated_ray_warnings()
    quiet_ray_data()


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
        numbers = {k: v for k, v in metrics.items() if _is_number(v) and k != "step"}
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


def _is_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value)


def _json_default(value: Any):
    return float(value) if hasattr(value, "__float__") else str(value)


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """{"train": {"batch_size": 32}} → {"train.batch_size": 32} (MLflow params are flat)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


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


# ---------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------


def _pyplot():
    """matplotlib.pyplot on the Agg backend (no display on a cluster node); ImportError with
    the install command when matplotlib is missing."""
    try:
        import matplotlib  # optional

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # optional
    except ImportError as error:
        raise ImportError(
            "plots need matplotlib: pip install matplotlib (or pip install -e '.[tune]')"
        ) from error
    return plt


def plot_learning_curves(
    history: list[dict], path: str | os.PathLike, train_rows: list[dict] | None = None
) -> str:
    """A PNG with the run's curves: losses and learning rate (from `train_rows`, the logged
    steps, else the evaluation windows' means in `history`), STS-B dev Spearman and throughput
    (sentences/s) at each evaluation. Returns the path."""
    plt = _pyplot()
    train = [row for row in (train_rows or []) if row.get("kind", "train") == "train"]
    source = train or [row for row in history if row.get("step", 0) > 0]
    loss_keys = sorted({k for row in source for k in row if k.startswith("loss")})
    figure, axes = plt.subplots(2, 2, figsize=(11, 7))
    (loss_ax, lr_ax), (dev_ax, speed_ax) = axes

    for key in loss_keys:
        points = [(r["step"], r[key]) for r in source if _is_number(r.get(key))]
        if points:
            label = key.removeprefix("loss_") if key != "loss" else key
            loss_ax.plot(*zip(*points), label=label, marker=_marker(points))
    loss_ax.set(title="training loss", xlabel="step")
    if loss_keys:
        positive = all(r[k] > 0 for r in source for k in loss_keys if _is_number(r.get(k)))
        loss_ax.set_yscale("log" if positive else "symlog")  # terms differ by orders
        loss_ax.legend(fontsize=8)

    _line(lr_ax, source, "lr", "learning rate")
    _line(dev_ax, history, "stsb_dev_spearman", "STS-B dev Spearman")
    _line(speed_ax, [r for r in history if r.get("step", 0) > 0], "sentences_per_s",
          "throughput (sentences/s, per evaluation window)")  # fmt: skip
    return _save(figure, path, plt)


def _save(figure, path, plt) -> str:
    """Lay out, write the PNG (creating its directory) and free the figure."""
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return str(path)


def _marker(points: list) -> str | None:
    return "o" if len(points) <= 30 else None  # a short run's few points stay visible


def _line(axis, rows: list[dict], key: str, title: str) -> None:
    points = [(r["step"], r[key]) for r in rows if _is_number(r.get(key))]
    if points:
        axis.plot(*zip(*points), marker=_marker(points))
    else:
        axis.text(0.5, 0.5, "no data", ha="center", va="center", transform=axis.transAxes)
    axis.set(title=title, xlabel="step")


def write_run_plots(
    output_dir: str | os.PathLike, history: list[dict], train_log_path: str | os.PathLike | None
) -> str | None:
    """`<output_dir>/learning_curves.png` for a finished run (next to metrics.json); None, with
    one line saying why, when matplotlib is missing: a plot never fails a finished run."""
    rows = read_train_log(train_log_path) if train_log_path else []
    try:
        return plot_learning_curves(history, Path(output_dir) / PLOT_FILE, rows)
    except ImportError as error:
        log.warning("no %s: %s", PLOT_FILE, error)
        return None


@dataclass
class Panel:
    """One chart of a figure: named series of (x, y) points, and horizontal reference lines
    (a value that has no x, e.g. the uncompressed encoder beside compressed sizes)."""

    title: str
    xlabel: str
    series: dict[str, list[tuple[float, float]]]
    references: dict[str, float] = field(default_factory=dict)
    xticks: list[float] | None = None  # e.g. the output sizes, so each size is labelled
    xscale: str = "linear"


def plot_panels(panels: list[Panel], path: str | os.PathLike, title: str | None = None) -> str:
    """A PNG with one chart per panel, two a row. Returns the path."""
    plt = _pyplot()
    columns = 1 if len(panels) == 1 else 2
    rows = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5.5 * columns, 3.6 * rows), squeeze=False)
    for axis, panel in zip(axes.flat, panels):
        for label, points in panel.series.items():
            points = [(x, y) for x, y in points if _is_number(y)]
            if points:
                axis.plot(*zip(*points), label=label, marker=_marker(points))
        for label, value in panel.references.items():
            axis.axhline(value, linestyle="--", color="grey", label=label)
        if not any(panel.series.values()) and not panel.references:
            axis.text(0.5, 0.5, "no data", ha="center", va="center", transform=axis.transAxes)
        axis.set_xscale(panel.xscale)
        if panel.xticks:
            axis.set_xticks(panel.xticks, [f"{x:g}" for x in panel.xticks])
            axis.minorticks_off()
        axis.set(title=panel.title, xlabel=panel.xlabel)
        if len(panel.series) + len(panel.references) > 1:
            axis.legend(fontsize=8)
    for axis in list(axes.flat)[len(panels) :]:
        axis.set_visible(False)
    if title:
        figure.suptitle(title)
    return _save(figure, path, plt)


def write_panels(panels: list[Panel], path: str | os.PathLike, title: str | None = None):
    """`plot_panels` for a finished run: None, with one line saying why, when matplotlib is
    missing (a plot never fails a run that has its results)."""
    try:
        return plot_panels(panels, path, title)
    except ImportError as error:
        log.warning("no %s: %s", Path(path).name, error)
        return None
