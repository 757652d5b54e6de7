"""The tiny corpus and the tiny training config that tests train on, and the finished tiny run.

`tiny_corpus` writes the first lines of the shipped Wikipedia sentences; `tiny_config` loads
jobs/configs/informin_tiny.yaml (a tiny model, 16 tokens, 8 rows a worker, 4 steps) with the
test's model, corpus and output directory and its own overrides on top. Later overrides win,
as on the command line.

`finished_tiny_run` trains the session's one tiny run (the `tiny_run` fixture): 2 workers,
4 steps, a corpus with 2 empty lines and 1 duplicate, checkpoints under a storage path and run
name, and its checkpoint chosen by nDCG@10 on the dev split of a tiny BEIR directory
(`tiny_beir_dir`: eval.select_by=retrieval:dev). Tests of the trainer's outputs, the selection,
the run identity and the export assert against it.
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


def tiny_config(model_path: str, corpus: Path | str, output: Path, *overrides: str, config=None):
    """informin_tiny.yaml for `model_path` on `corpus`, writing to `output`, then `overrides`.
    `config`: another config class (default TrainingConfig)."""
    from distributed_emb.config import TrainingConfig, load_config

    return load_config(
        config or TrainingConfig,
        str(TINY_YAML),
        [f"model.path={model_path}", f"data.path={corpus}", f"output.dir={output}", *overrides],
    )


def tiny_beir_dir(path: Path, documents: int = 40) -> Path:
    """A BEIR directory at `path` from shipped Wikipedia sentences (past the tiny corpus's):
    each document a sentence, query i the second half of sentence i's words, relevant to
    document i alone; qrels for dev (queries 0-9), test (10-14) and train (15-19)."""
    import json

    from distributed_emb.paths import shipped_corpus

    lines = Path(shipped_corpus("wiki_sentences.txt")).read_text().splitlines()
    sentences = [line for line in lines[400:] if len(line.split()) >= 8][:documents]
    (path / "qrels").mkdir(parents=True, exist_ok=True)
    (path / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "text": s}) + "\n" for i, s in enumerate(sentences))
    )
    queries = [" ".join(s.split()[len(s.split()) // 2 :]) for s in sentences[:20]]
    (path / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{i}", "text": q}) + "\n" for i, q in enumerate(queries))
    )
    for split, ids in (("dev", range(10)), ("test", range(10, 15)), ("train", range(15, 20))):
        judged = "".join(f"q{i}\td{i}\t1\n" for i in ids)
        (path / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + judged)
    return path


TINY_RUN_SETTINGS = (
    "data.max_rows=null",
    "data.deduplicate=true",
    "train.max_steps=4",
    "eval.eval_steps=1",  # every step: engines and restarts are compared step by step
    "loss.reconstruction_weight=0.5",
    "output.run_name=tiny",
)


def tiny_run_config(model_path: str, directory: Path, *overrides: str):
    """The tiny run's config in `directory` (corpus.txt, beir/, storage/, and `run/` for the
    output), with `overrides` on top."""
    from distributed_emb.paths import shipped_corpus

    first = Path(shipped_corpus("wiki_sentences.txt")).read_text().splitlines()[0]
    # 300 sentences plus 2 empty lines and 1 duplicate, which the run drops and counts.
    corpus = tiny_corpus(directory / "corpus.txt", lines=300, extra=("", "   ", first))
    return tiny_config(
        model_path,
        corpus,
        directory / "run",
        *TINY_RUN_SETTINGS,
        f"output.storage_path={directory / 'storage'}",
        f"eval.retrieval_dir={tiny_beir_dir(directory / 'beir')}",
        "eval.select_by=retrieval:dev",
        *overrides,
    )


def finished_tiny_run(model_path: str, directory: Path):
    """(config, TrainingResult) of the tiny run, trained on the Ray this process is connected
    to."""
    from distributed_emb.train.driver import run_training

    config = tiny_run_config(model_path, directory)
    return config, run_training(config)


def unread_stream(rows: int = 64, shards: tuple = (("part-0.arrow", 64),)):
    """A stand-in TrainingStream for tests that stop before anything reads it: indexed shards
    that do not exist, with a real identity (what a checkpoint's position is checked against)."""
    from distributed_emb.data.indexed_shards import ShardIndex
    from distributed_emb.data.rank_batches import IndexedSource
    from distributed_emb.data.training_stream import TrainingStream

    return TrainingStream(IndexedSource(ShardIndex("unread", shards)), rows)
