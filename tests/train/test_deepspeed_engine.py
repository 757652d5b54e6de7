"""DeepSpeed ZeRO-2 on 2 CPU workers trains like DDP: same losses for the first steps."""

import json

import pytest

from distributed_emb.config import TrainingConfig, load_config
from distributed_emb.paths import shipped_corpus


def _config(tmp_path, tiny_bert_path, engine: str, extra=()):
    corpus = tmp_path / "corpus.txt"
    if not corpus.exists():
        corpus.write_text(
            "\n".join(open(shipped_corpus("wiki_sentences.txt")).read().splitlines()[:200])
        )
    return load_config(
        TrainingConfig,
        "jobs/configs/informin_tiny.yaml",
        [
            f"model.path={tiny_bert_path}",
            f"data.path={corpus}",
            "train.max_steps=3",
            "eval.eval_steps=1",
            "eval.max_pairs=16",
            "loss.reconstruction_weight=0.5",
            f"train.engine={engine}",
            "train.deepspeed.zero_stage=2",
            f"output.dir={tmp_path / engine}",
            *extra,
        ],
    )


@pytest.mark.slow
@pytest.mark.ray
def test_zero2_matches_ddp_losses(ray_local, tmp_path, tiny_bert_path):
    from distributed_emb.train.trainer import run_training

    histories = {}
    for engine in ("ddp", "deepspeed"):
        run_training(_config(tmp_path, tiny_bert_path, engine))
        metrics = json.loads((tmp_path / engine / "metrics.json").read_text())
        histories[engine] = metrics["history"]
    ddp, zero = histories["ddp"], histories["deepspeed"]
    assert [r["step"] for r in zero] == [0, 1, 2, 3]
    assert zero[0]["stsb_dev_spearman"] == pytest.approx(ddp[0]["stsb_dev_spearman"], abs=1e-6)
    for a, b in zip(ddp[1:], zero[1:]):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4), (a, b)
        assert b["loss_contrastive"] == pytest.approx(a["loss_contrastive"], rel=1e-4)
        assert b["lr"] == pytest.approx(a["lr"], rel=1e-6)
    # Training moved the weights the same way: the dev scores after each step agree.
    for a, b in zip(ddp[1:], zero[1:]):
        assert b["stsb_dev_spearman"] == pytest.approx(a["stsb_dev_spearman"], abs=0.05)
