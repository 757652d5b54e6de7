"""Pictures of a search (PNG, matplotlib's Agg backend: no display needed):

- `metric_vs_<key>.png`, one per searched key: each trial's best selection score (eval.select_by:
  STS-B dev unless the user chose a retrieval split) against its value (log axis for
  log-uniform keys), marked by how the trial ended;
- `learning_curves.png`: the selection score against optimizer step, one line per trial
  (dashed when the scheduler stopped it early), so ASHA's cuts are visible.
"""

from __future__ import annotations

from pathlib import Path

from distributed_emb.tune.results import COMPLETED, ERROR, STOPPED, TrialSummary
from distributed_emb.tune.search_space import Distribution

MARKERS = {COMPLETED: "o", STOPPED: "v", ERROR: "x"}


def _pyplot():
    import matplotlib  # optional

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # optional

    return plt


def plot_metric_vs_params(
    trials: list[TrialSummary],
    space: dict[str, Distribution],
    output: Path,
    metric: str = "STS-B dev Spearman",
) -> list[Path]:
    plt = _pyplot()
    output.mkdir(parents=True, exist_ok=True)
    paths = []
    for key, distribution in space.items():
        figure, axis = plt.subplots(figsize=(5, 3.5))
        categorical = distribution.kind in ("choice", "grid")
        ticks = [str(v) for v in distribution.values] if categorical else []
        for status, marker in MARKERS.items():
            points = [
                (t.params.get(key), t.best_score)
                for t in trials
                if t.status == status and t.best_score is not None and key in t.params
            ]
            if not points:
                continue
            xs = [ticks.index(str(x)) if categorical else x for x, _ in points]
            axis.scatter(xs, [y for _, y in points], marker=marker, label=status)
        if categorical:
            axis.set_xticks(range(len(ticks)), ticks)
        elif distribution.kind == "loguniform":
            from matplotlib.ticker import NullFormatter  # optional

            axis.set_xscale("log")
            axis.xaxis.set_minor_formatter(NullFormatter())  # unlabelled minor ticks: no overlap
        axis.set_xlabel(key)
        axis.set_ylabel(f"best {metric} (× 100)")
        axis.legend(fontsize="small")
        axis.grid(alpha=0.3)
        figure.tight_layout()
        path = output / f"metric_vs_{key.replace('.', '_')}.png"
        figure.savefig(path, dpi=120)
        plt.close(figure)
        paths.append(path)
    return paths


def plot_learning_curves(
    trials: list[TrialSummary], output: Path, metric: str = "STS-B dev Spearman"
) -> Path:
    plt = _pyplot()
    output.mkdir(parents=True, exist_ok=True)
    figure, axis = plt.subplots(figsize=(6, 4))
    for trial in trials:
        if not trial.history:
            continue
        steps, scores = zip(*trial.history)
        style = "--" if trial.status == STOPPED else ":" if trial.status == ERROR else "-"
        axis.plot(steps, scores, style, marker=".", label=f"{trial.trial_id} ({trial.status})")
    axis.set_xlabel("optimizer step")
    axis.set_ylabel(f"{metric} (× 100)")
    axis.legend(fontsize="x-small")
    axis.grid(alpha=0.3)
    figure.tight_layout()
    path = output / "learning_curves.png"
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
