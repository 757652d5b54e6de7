"""A real Ray Train run on a corpus with a hard-negative column (data.negative_column, the layout
jobs/mine_negatives.py writes): 2 workers, the token cache (the default config's data path),
the negatives gathered across workers as InfoNCE candidates, a row without its negative
dropped and counted."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROWS = 64


def _mined_corpus(path: Path) -> Path:
    """id, text, negative (another sentence of the shipped corpus), negative_id; one row's
    negative is null."""
    from distributed_emb.paths import shipped_corpus

    lines = Path(shipped_corpus("wiki_sentences.txt")).read_text().splitlines()
    texts, others = lines[:ROWS], lines[ROWS : 2 * ROWS]
    negatives = [None if i == 5 else text for i, text in enumerate(others)]
    ids = list(range(ROWS))
    table = pa.table(
        {"id": ids, "text": texts, "negative": negatives, "negative_id": [i + ROWS for i in ids]}
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def test_the_workers_collate_the_negative_column(tiny_bert_path):
    """What the run below cannot see from outside: each worker's collator reads the column."""
    from transformers import AutoTokenizer

    from distributed_emb.config import TrainingConfig, load_config
    from distributed_emb.train.worker import _collator

    config = load_config(
        TrainingConfig, None, [f"model.path={tiny_bert_path}", "data.negative_column=negative"]
    )
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_path)
    collate = _collator(config.model, config.data, config.loss, tokenizer, seed=0)
    assert collate.negative_column == "negative"


@pytest.mark.slow
@pytest.mark.ray
def test_a_mined_corpus_trains_end_to_end(ray_local, tiny_bert_path, tmp_path):
    from harness.tiny_run import tiny_config

    from distributed_emb.train.driver import run_training

    config = tiny_config(
        tiny_bert_path,
        _mined_corpus(tmp_path / "negatives" / "part-000000000001.parquet"),
        tmp_path / "run",
        "data.negative_column=negative",
        "data.max_rows=null",
        f"data.token_cache_dir={tmp_path / 'cache'}",
        "train.max_steps=2",
        "eval.eval_steps=2",
        "eval.score_start=false",
    )
    run_training(config)

    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["corpus"]["kept"] == ROWS - 1 and metrics["corpus"]["dropped"] == {"empty": 1}
    assert [row["step"] for row in metrics["history"]] == [2]
    assert metrics["history"][0]["loss_contrastive"] > 0
    (key,) = (tmp_path / "cache").glob("*/key.json")  # the cache's ids include the negatives
    assert json.loads(key.read_text())["cleaning"]["columns"] == ["text", "negative"]
