"""The tiny corpus and the tiny training config that tests train on.

`tiny_corpus` writes the first lines of the shipped Wikipedia sentences; `tiny_config` loads
jobs/configs/informin_tiny.yaml (a tiny model, 16 tokens, 8 rows a worker, 4 steps) with the
test's model, corpus and output directory and its own overrides on top. Later overrides win,
as on the command line.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TINY_YAML = REPO / "jobs" / "configs" / "informin_tiny.yaml"


def tiny_corpus(path: Path, lines: int = 300, extra: tuple[str, ...] = ()) -> Path:
    """`path` holding the first `lines` shipped Wikipedia sentences (plus `extra` lines)."""
    from distributed_emb.paths import shipped_corpus

    head = Path(shipped_corpus("wiki_sentences.txt")).read_text().splitlines()[:lines]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([*head, *extra]) + "\n")
    return path


def tiny_config(model_path: str, corpus: Path, output: Path, *overrides: str, config=None):
    """informin_tiny.yaml for `model_path` on `corpus`, writing to `output`, then `overrides`.
    `config`: another config class (default TrainingConfig)."""
    from distributed_emb.config import TrainingConfig, load_config

    return load_config(
        config or TrainingConfig,
        str(TINY_YAML),
        [f"model.path={model_path}", f"data.path={corpus}", f"output.dir={output}", *overrides],
    )
