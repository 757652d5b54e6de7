"""Plain distillation through the training job: a student pulled onto a frozen teacher's vectors
(loss.contrastive_weight=0, loss.distill_weight>0), with the bad settings refused first."""

import json

import numpy as np
import pytest
from conftest import build_tiny_bert

from distributed_emb.checks import ConfigError
from distributed_emb.config import TrainingConfig, load_config
from distributed_emb.train.teacher import check_teacher


def _config(tmp_path, student: str, teacher: str | None, *extra: str) -> TrainingConfig:
    from harness.tiny_run import tiny_config, tiny_corpus

    overrides = [
        "model.mlp_head=none",
        "loss.contrastive_weight=0",
        "loss.reconstruction_weight=0",
        "loss.distill_weight=1",
    ]
    if teacher is not None:
        overrides.append(f"loss.distill_teacher={teacher}")
    corpus = tiny_corpus(tmp_path / "corpus.txt", lines=256)
    return tiny_config(student, corpus, tmp_path / "run", *overrides, *extra)


@pytest.mark.parametrize(
    "overrides, key, says",
    [
        (["loss.distill_teacher=TEACHER"], r"loss\.distill_teacher", "distill_weight is 0"),
        (["loss.distill_weight=-1"], r"loss\.distill_weight", ">= 0"),
        (["loss.contrastive_weight=-0.5"], r"loss\.contrastive_weight", ">= 0"),
        (
            ["loss.distill_weight=1", "loss.distill_teacher=TEACHER", "model.mlp_head=train_only"],
            r"model\.mlp_head",
            "export drops",
        ),
        (
            ["loss.contrastive_weight=0", "loss.reconstruction_weight=0"],
            r"^loss:",
            "nothing to train",
        ),
        (
            ["loss.distill_weight=1", "loss.distill_teacher=/no/such/teacher"],
            r"loss\.distill_teacher",
            "not an existing directory",
        ),
    ],
)
def test_bad_distillation_settings_name_the_key(overrides, key, says, tiny_bert_path):
    overrides = [o.replace("TEACHER", tiny_bert_path) for o in overrides]
    with pytest.raises(ConfigError, match=f"{key}.*{says}"):
        load_config(TrainingConfig, None, overrides)


def test_no_teacher_named_means_the_starting_model(tiny_bert_path):
    """loss.distill_weight alone pulls toward the model training starts from (train/teacher.py
    loads model.path when no teacher is named): the regulariser that keeps what it knows."""
    config = load_config(
        TrainingConfig,
        None,
        [f"model.path={tiny_bert_path}", "loss.distill_weight=0.1", "model.mlp_head=none"],
    )
    assert config.loss.distill_teacher is None and config.loss.needs_teacher


def test_a_teacher_of_another_width_or_vocabulary_fails_before_ray(tmp_path, tiny_bert_path):
    from transformers import BertTokenizerFast

    wide = build_tiny_bert(tmp_path / "wide", hidden=48)
    config = _config(tmp_path, tiny_bert_path, wide)
    with pytest.raises(ConfigError, match=r"loss\.distill_teacher: .* 48 dimensions.* 32"):
        check_teacher(config.model, config.loss)

    other_vocab = tmp_path / "other_vocab"
    build_tiny_bert(other_vocab)
    (other_vocab / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a"]))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (other_vocab / name).unlink(missing_ok=True)
    BertTokenizerFast(str(other_vocab / "vocab.txt")).save_pretrained(other_vocab)
    config = _config(tmp_path, tiny_bert_path, str(other_vocab))
    with pytest.raises(
        ConfigError, match=r"loss\.distill_teacher: .*vocabulary \(6 tokens\) is not model\.path"
    ):
        check_teacher(config.model, config.loss)


@pytest.mark.slow
@pytest.mark.ray
def test_distillation_pulls_the_student_onto_the_teacher(ray_local, tmp_path, tiny_bert_path):
    """Teacher: the tiny BERT fixture; student: another random tiny BERT of the same width.
    After 8 steps the exported student's vectors are much nearer the teacher's than the
    start's (mean squared distance down by more than 30%), and the loss logged is the
    distillation term alone."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    from distributed_emb.evaluation.senteval_data import read_sts_benchmark
    from distributed_emb.model.embedder import embed_module
    from distributed_emb.model.encoder import TrainableEncoder
    from distributed_emb.paths import shipped_senteval_dir
    from distributed_emb.train.driver import run_training

    student = build_tiny_bert(tmp_path / "student", seed=1)
    config = _config(
        tmp_path,
        student,
        tiny_bert_path,
        "train.max_steps=8",
        "train.learning_rate=1e-3",
        "eval.eval_steps=4",
        "eval.start_is_candidate=false",
    )
    result = run_training(config)

    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    trained = [row for row in metrics["history"] if row["step"] > 0]
    assert [row["step"] for row in trained] == [4, 8]
    assert all("loss_distill" in row and "loss_contrastive" not in row for row in trained)

    # Held-out sentences (STS-B dev, never trained on): squared distance to the teacher.
    sentences = read_sts_benchmark(shipped_senteval_dir(), "dev").sentences1[:64]
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_path)

    def vectors(path: str) -> np.ndarray:
        encoder = TrainableEncoder(path, pooler=config.model.pooler, mlp_head=False)
        return embed_module(encoder, tokenizer, sentences, config.model.max_seq_length)

    teacher = vectors(tiny_bert_path)
    exported = SentenceTransformer(result.model_dir, device="cpu").encode(sentences)
    before = float(np.mean((vectors(student) - teacher) ** 2))
    after = float(np.mean((exported - teacher) ** 2))
    assert after < 0.7 * before, (before, after)  # 0.80 → 0.42 when written


def test_the_comparisons_distill_arm_trains_the_student_on_the_teachers_vectors(
    tmp_path, tiny_bert_path, monkeypatch
):
    """infocse.compare's `distill` arm: same student, sentences and budget as the SimCSE arm;
    InfoNCE off, the teacher's MSE on, and the exported (not a train-only MLP) vector distilled."""
    from types import SimpleNamespace

    from distributed_emb.infocse import compare
    from distributed_emb.infocse.rounds_config import InfoCSEConfig

    seen = {}

    def fake_run_training(training):
        seen["training"] = training
        return SimpleNamespace(model_dir="exported", metrics={"steps": 7})

    monkeypatch.setattr(compare, "run_training", fake_run_training)
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("one sentence\nanother one\n")
    config = load_config(
        InfoCSEConfig, "jobs/configs/infocse_default.yaml", [f"output.dir={tmp_path}"]
    )
    row = compare._sentence_arm(
        config,
        tiny_bert_path,
        sentences,
        tmp_path / "distill",
        contrastive_weight=0.0,
        reconstruction_weight=0.0,
        mlm_weight=0.0,
        distill_weight=1.0,
        distill_teacher=tiny_bert_path,
    )
    training = seen["training"]
    assert row == {"model_dir": "exported", "steps": 7}
    assert training.model.path == tiny_bert_path and training.data.path == str(sentences)
    assert training.loss.contrastive_weight == 0 and training.loss.distill_weight == 1
    assert training.loss.distill_teacher == tiny_bert_path
    assert training.model.mlp_head == "none"
    assert training.train == config.training.train  # the budget every arm shares
    assert config.training.loss.distill_weight == 0  # the shared config is left as it was
