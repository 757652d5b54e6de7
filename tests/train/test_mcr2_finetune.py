"""End-to-end MCR² fine-tuning (jobs/finetune_mcr2.py): the encoder and a compression head
written by the compression job, trained together on Ray Train with the MCR² term.

Checked: the run starts exactly at the compression job's export; the objective adds exactly
γ·(the MCR² loss of the first view, the groups, the two views and the teacher's rows); bad
settings are refused naming the key; a tiny run trains and exports encoder + head."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

from distributed_emb.checks import ConfigError
from distributed_emb.config import TrainingConfig, load_config
from distributed_emb.losses.distillation import similarity_distillation_loss
from distributed_emb.losses.loss_config import LossConfig
from distributed_emb.losses.mcr2 import MCR2LossConfig, coding_rate, compressed_coding_rate
from distributed_emb.mcr2.export_with_head import export_compressed_model
from distributed_emb.model.compression_head import CompressionHead, load_head
from distributed_emb.paths import shipped_corpus
from distributed_emb.train.step import embedding_objective

HEAD_DIM = 8
SENTENCES = ["a cat sat on the mat.", "stocks fell sharply today.", "the dog ran.", "rain."]


@pytest.fixture(scope="module")
def head_export(tmp_path_factory, tiny_bert_path) -> str:
    """What jobs/train_mcr2.py writes per size: the encoder + a (here random) 8-d head."""
    torch.manual_seed(0)
    head = CompressionHead(32, HEAD_DIM, hidden_dims=[])
    directory = tmp_path_factory.mktemp("mcr2") / f"mcr2-{HEAD_DIM}"
    export_compressed_model(directory, tiny_bert_path, head, pooler="mean", max_seq_length=32)
    return str(directory)


def test_a_saved_head_loads_with_its_weights(tmp_path):
    torch.manual_seed(1)
    head = CompressionHead(16, 4, hidden_dims=[12], activation="tanh").eval()
    from distributed_emb.model.compression_head import save_head

    save_head(head, tmp_path, {"output_dim": 4, "hidden_dims": [12], "activation": "tanh"})
    loaded = load_head(tmp_path).eval()
    x = torch.randn(5, 16)
    torch.testing.assert_close(loaded(x), head(x))
    with pytest.raises(FileNotFoundError, match="compression_head.safetensors is missing"):
        load_head(tmp_path / "nowhere")


def test_fine_tuning_starts_at_the_compression_jobs_export(tiny_bert_path, head_export):
    """The trainable encoder with the exported head embeds exactly as the export does, and so
    does its own export."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    from distributed_emb.model.embedder import embed_module
    from distributed_emb.model.encoder import TrainableEncoder
    from distributed_emb.model.export import export_sentence_transformer

    encoder = TrainableEncoder(
        tiny_bert_path, "mean", mlp_head=False, compression_head=load_head(head_export)
    )
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert_path)
    trained_view = embed_module(encoder, tokenizer, SENTENCES, 32)
    assert trained_view.shape == (len(SENTENCES), HEAD_DIM)
    start = SentenceTransformer(head_export, device="cpu").encode(SENTENCES)
    np.testing.assert_allclose(trained_view, start, atol=1e-5)

    out = export_sentence_transformer(encoder, tokenizer, str(head_export) + "-again", 32)
    again = SentenceTransformer(out, device="cpu").encode(SENTENCES)
    np.testing.assert_allclose(again, start, atol=1e-5)


def test_the_objective_adds_gamma_times_the_mcr2_loss_of_the_first_view():
    torch.manual_seed(2)
    b, d, teacher_width = 12, 6, 10
    z1 = torch.randn(b, d, dtype=torch.float64, requires_grad=True)
    z2 = z1.detach() + 0.1 * torch.randn(b, d, dtype=torch.float64)
    groups = torch.arange(b) // 4  # three documents of four rows
    teacher = torch.randn(2 * b, teacher_width, dtype=torch.float64)
    mcr2 = MCR2LossConfig(eps=0.5, pair_weight=0.7, compress_weight=0.9, distill_weight=3.0)
    weights = LossConfig(
        contrastive_weight=0.0, reconstruction_weight=0.0, mcr2_weight=2.5, mcr2=mcr2
    )
    loss, metrics = embedding_objective(z1, z2, weights, groups, teacher)

    expected = 2.5 * (
        -coding_rate(z1, 0.5)
        + 0.9 * compressed_coding_rate(z1, groups, 0.5)
        - 0.7 * F.cosine_similarity(z1, z2, dim=1).mean()
        + 3.0 * similarity_distillation_loss(z1, teacher[:b], 0.05)
    )
    torch.testing.assert_close(loss, expected)
    assert {"mcr2_rate_reduction", "mcr2_pair_cosine", "mcr2_similarity_kl"} <= set(metrics)
    assert weights.needs_teacher
    with pytest.raises(ValueError, match="group"):
        embedding_objective(z1, z2, weights, None, teacher)
    with pytest.raises(ValueError, match="teacher vectors"):
        embedding_objective(z1, z2, weights, groups, None)


def _corpus(tmp_path) -> str:
    lines = open(shipped_corpus("wiki_sentences.txt")).read().splitlines()[:256]
    path = tmp_path / "training_sentences.parquet"
    pq.write_table(pa.table({"text": lines, "cluster_id": [i // 8 for i in range(256)]}), path)
    return str(path)


def _config(tmp_path, encoder: str, head: str, *extra: str) -> TrainingConfig:
    overrides = [
        f"model.path={encoder}",
        f"model.compression_head={head}",
        f"data.path={_corpus(tmp_path)}",
        "model.max_seq_length=16",
        "data.max_rows=256",
        "train.batch_size=16",
        "train.max_steps=4",
        "eval.eval_steps=2",
        "eval.max_pairs=64",
        "eval.test_after_training=false",
        f"output.dir={tmp_path / 'run'}",
    ]
    return load_config(TrainingConfig, "jobs/configs/mcr2_finetune.yaml", overrides + list(extra))


@pytest.mark.parametrize(
    "overrides, key, says",
    [
        (["model.compression_head=/no/such/head"], r"model\.compression_head", "not a directory"),
        (["model.mlp_head=train_only"], r"model\.mlp_head", "must be none"),
        (["data.group_column=null"], r"data\.group_column", "packs each group"),
        (["loss.mcr2.eps=0"], r"loss\.mcr2\.eps", "> 0"),
        (["loss.mcr2.distill_weight=-1"], r"loss\.mcr2\.distill_weight", ">= 0"),
        (["loss.mcr2_weight=-1"], r"loss\.mcr2_weight", ">= 0"),
        (["model.pooler=cls"], r"model\.pooler", "read mean pooling"),
    ],
)
def test_bad_fine_tuning_settings_name_the_key(
    overrides, key, says, tmp_path, tiny_bert_path, head_export
):
    """Refused when the config loads, or (the head's files) by the job's checks before Ray."""
    from distributed_emb.train.driver import check_compression_head

    with pytest.raises(ConfigError, match=f"{key}.*{says}"):
        check_compression_head(_config(tmp_path, tiny_bert_path, head_export, *overrides))


def test_the_default_fine_tuning_config_reads_the_compression_jobs_outputs():
    import yaml

    raw = yaml.safe_load(open("jobs/configs/mcr2_finetune.yaml"))
    assert raw["model"]["compression_head"] == "outputs/mcr2/models/mcr2-64"
    assert raw["data"]["path"] == "outputs/mcr2/training_sentences.parquet"
    assert raw["data"]["group_column"] == "cluster_id"  # mcr2/data.py's column name
    assert raw["loss"]["mcr2_weight"] > 0 and raw["loss"]["contrastive_weight"] == 0


@pytest.mark.slow
@pytest.mark.ray
def test_fine_tuning_trains_the_encoder_and_head_and_exports_both(
    ray_local, tmp_path, tiny_bert_path, head_export
):
    """4 steps on 2 workers: the history logs the MCR² terms, and the export (encoder + head,
    unit 8-d vectors) differs from the start in both the encoder and the head."""
    from sentence_transformers import SentenceTransformer

    from distributed_emb.train.driver import run_training

    config = _config(
        tmp_path, tiny_bert_path, head_export, "train.learning_rate=1e-3",
        "eval.start_is_candidate=false",
    )  # fmt: skip
    result = run_training(config)

    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    trained = [row for row in metrics["history"] if row["step"] > 0]
    assert [row["step"] for row in trained] == [2, 4]
    assert all("mcr2_rate_reduction" in row and "loss_contrastive" not in row for row in trained)

    exported = SentenceTransformer(result.model_dir, device="cpu")
    vectors = exported.encode(SENTENCES)
    assert vectors.shape == (len(SENTENCES), HEAD_DIM)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    start = SentenceTransformer(head_export, device="cpu")
    assert not np.allclose(vectors, start.encode(SENTENCES), atol=1e-4)

    def dense_weight(model) -> torch.Tensor:
        dense = [m for m in model if type(m).__name__ == "Dense"]
        return dense[-1].linear.weight.detach()

    assert not torch.allclose(dense_weight(exported), dense_weight(start))  # the head moved

    def word_embeddings(model) -> torch.Tensor:
        return model[0].auto_model.embeddings.word_embeddings.weight.detach()

    assert not torch.allclose(word_embeddings(exported), word_embeddings(start))  # the encoder
