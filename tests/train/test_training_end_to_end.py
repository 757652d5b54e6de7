"""A real TorchTrainer run: 2 workers, tiny BERT, checkpoints, best-by-dev export."""

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
    from distributed_emb.train.checkpointing import load_encoder_weights
    from distributed_emb.train.loop import build_encoder

    tiny_config, result = tiny_run
    metrics = json.loads((Path(tiny_config.output.dir) / "metrics.json").read_text())

    assert [row["step"] for row in metrics["history"]] == [0, 1, 2, 3, 4]
    assert metrics["steps"] == 4 and metrics["global_batch"] == 16
    assert metrics["corpus"]["kept"] == 300
    assert metrics["corpus"]["dropped"] == {"empty": 2, "duplicate": 1}
    assert metrics["stsb_dev_before"] == metrics["history"][0]["stsb_dev_spearman"]
    assert all(row["loss_reconstruction"] > 0 for row in metrics["history"][1:])  # dropout on
    best = max(metrics["history"], key=lambda r: r["stsb_dev_spearman"])
    assert metrics["best_step"] == best["step"]

    # The exported model equals the best checkpoint's encoder.
    encoder = build_encoder(tiny_config)
    load_encoder_weights(encoder, result.best_checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(tiny_config.model_path)
    sentences = read_sts_benchmark(shipped_senteval_dir(), "dev").sentences1[:16]
    expected = embed_module(encoder, tokenizer, sentences, tiny_config.model.max_seq_length)
    exported = SentenceTransformer(result.model_dir, device="cpu").encode(sentences)
    np.testing.assert_allclose(exported, expected, rtol=1e-5, atol=1e-5)
    # The weights moved during training (the run did something).
    fresh = embed_module(build_encoder(tiny_config), tokenizer, sentences, 16)
    if metrics["best_step"] > 0:
        assert not np.allclose(fresh, expected, atol=1e-6)
