"""A real Ray Train run with length-grouped batches: every planned step, across an epoch
boundary, with the loop's timing windows accounting for every step."""

import pytest


@pytest.mark.slow
@pytest.mark.ray
def test_length_grouped_run_trains_every_planned_step(ray_local, tiny_bert_path, tmp_path):
    from harness.tiny_run import tiny_config, tiny_corpus

    from distributed_emb.train.driver import run_training

    config = tiny_config(
        tiny_bert_path,
        tiny_corpus(tmp_path / "corpus.txt", lines=100),
        tmp_path / "run",
        "data.max_rows=null",
        "data.length_group_batches=4",  # pools of 32 rows: 3 full pools + 4 rows
        "train.num_workers=1",
        "train.batch_size=8",
        "train.epochs=2",
        "train.max_steps=null",
        "eval.eval_steps=6",
    )
    metrics = run_training(config).metrics

    history = metrics["history"]
    assert [row["step"] for row in history] == [0, 6, 12, 18, 24]  # 12 batches per epoch
    assert metrics["sentences_seen"] == 24 * 8 and history[-1]["epoch"] == 1
    trained = history[1:]
    assert sum(row["window_steps"] for row in trained) == 24
    assert all(0 < row["compute_fraction"] <= 1 and row["data_wait_s"] >= 0 for row in trained)
    assert all(row["tokens_per_s"] > 0 and row["peak_rss_mb"] > 0 for row in trained)
