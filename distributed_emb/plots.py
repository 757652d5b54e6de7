"""Plots of a run (learning curves) and of a method's results (panels), as PNG files; plots
are optional: matplotlib missing is one ImportError with the install command."""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from distributed_emb.tracking import is_number, read_train_log

log = logging.getLogger(__name__)

PLOT_FILE = "learning_curves.png"


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
        points = [(r["step"], r[key]) for r in source if is_number(r.get(key))]
        if points:
            label = key.removeprefix("loss_") if key != "loss" else key
            loss_ax.plot(*zip(*points), label=label, marker=_marker(points))
    loss_ax.set(title="training loss", xlabel="step")
    if loss_keys:
        positive = all(r[k] > 0 for r in source for k in loss_keys if is_number(r.get(k)))
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
    points = [(r["step"], r[key]) for r in rows if is_number(r.get(key))]
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
            points = [(x, y) for x, y in points if is_number(y)]
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
