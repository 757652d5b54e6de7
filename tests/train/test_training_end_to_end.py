"""A real TorchTrainer run: 2 workers, tiny BERT, checkpoints, and the export of the best
checkpoint by eval.select_by (here nDCG@10 on a tiny BEIR dev split; STS-B dev still
reported)."""

import json
from pathlib import Path

import numpy as np
import pytest

from distributed_emb.model.embedder import embed_module


@pytest.mark.slow
@pytest.mark.ray
def test_two_worker_run_checkpoints_evaluates_and_exports(ray_local, tiny_run):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    from distributed_emb.evaluation.senteval_data import read_sts_benchmark
    from distributed_emb.paths import shipped_senteval_dir
    from distributed_emb.train.checkpointing import STATE_FILE, load_encoder_weights
    from distributed_emb.train.worker import build_encoder

    tiny_config, result = tiny_run
    metrics = json.loads((Path(tiny_config.output.dir) / "metrics.json").read_text())

    assert [row["step"] for row in metrics["history"]] == [0, 1, 2, 3, 4]
    assert metrics["steps"] == 4 and metrics["global_batch"] == 16
    assert metrics["corpus"]["kept"] == 300
    assert metrics["corpus"]["dropped"] == {"empty": 2, "duplicate": 1}
    assert metrics["stsb_dev_before"] == metrics["history"][0]["stsb_dev_spearman"]
    assert all(row["loss_reconstruction"] > 0 for row in metrics["history"][1:])  # dropout on

    # Every evaluation scored STS-B dev and the BEIR dev split (never test, nor train), and
    # chose on the split's nDCG@10.
    history = metrics["history"]
    assert metrics["select_by"] == "retrieval:dev"
    for row in history:
        assert -100 <= row["stsb_dev_spearman"] <= 100
        assert row["select_score"] == row["retrieval_dev_ndcg_at_10"]
        assert not [k for k in row if k.startswith(("retrieval_test", "retrieval_train"))]
    # The export is the best nDCG@10 (a tie: the later step, which Ray Train keeps).
    best = max(history, key=lambda r: (r["retrieval_dev_ndcg_at_10"], r["step"]))
    assert metrics["best_step"] == best["step"]
    assert metrics["dev_best"] == best["retrieval_dev_ndcg_at_10"]
    assert metrics["dev_before"] == history[0]["retrieval_dev_ndcg_at_10"]
    assert metrics["stsb_dev_best"] == best["stsb_dev_spearman"]  # STS-B dev at that step
    # "exported": the step, or, when the start won, the one line that says the given model is
    # handed back unchanged; the job's summary prints that line once.
    from distributed_emb.train.driver import summarise_run

    summary = summarise_run(metrics).splitlines()
    if metrics["best_step"] == 0:
        assert metrics["exported"].startswith(
            "exported: the given model unchanged — no trained step beat it on nDCG@10 on "
            "retrieval dev (best trained "
        )
        assert summary.count(metrics["exported"]) == 1
    else:
        assert metrics["exported"] == f"step {metrics['best_step']}"
        assert not [line for line in summary if "given model" in line]
    state = json.loads((Path(result.best_checkpoint) / STATE_FILE).read_text())
    assert state["step"] == best["step"]

    # The exported model equals the best checkpoint's encoder.
    encoder = build_encoder(tiny_config.model, tiny_config.loss, tiny_config.train)
    load_encoder_weights(encoder, result.best_checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(tiny_config.model_path)
    sentences = read_sts_benchmark(shipped_senteval_dir(), "dev").sentences1[:16]
    expected = embed_module(encoder, tokenizer, sentences, tiny_config.model.max_seq_length)
    exported = SentenceTransformer(result.model_dir, device="cpu").encode(sentences)
    np.testing.assert_allclose(exported, expected, rtol=1e-5, atol=1e-5)
    # The weights moved during training (the run did something).
    fresh = embed_module(
        build_encoder(tiny_config.model, tiny_config.loss, tiny_config.train),
        tokenizer,
        sentences,
        16,
    )
    if metrics["best_step"] > 0:
        assert not np.allclose(fresh, expected, atol=1e-6)
