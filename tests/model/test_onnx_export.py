"""The ONNX export: one graph holding every module, agreeing with the torch model, or a refusal."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="the onnx extra (onnx, onnxruntime) is not installed")

from harness.jobs import run as run_job  # noqa: E402

from distributed_emb.evaluation.sts import read_stsb  # noqa: E402
from distributed_emb.model.compression_head import CompressionHead  # noqa: E402
from distributed_emb.model.onnx_embedder import OnnxEmbedder, SavedTokenizer  # noqa: E402
from distributed_emb.model.onnx_export import UnexportableModelError, export_onnx  # noqa: E402
from distributed_emb.model.onnx_files import read_export_info  # noqa: E402
from distributed_emb.model.serving_check import serving_check  # noqa: E402

MAX_SEQ_LENGTH = 16  # below many STS-B sentences' length: truncation is part of what is compared


@pytest.fixture(scope="module")
def head_model(tiny_bert_path, tmp_path_factory) -> str:
    """A tiny BERT, mean pooling and a two-layer compression head (32 → 16 → 8, then
    Normalize), saved as MCR² saves one, and exported to ONNX (fp32 and int8)."""
    import torch

    from distributed_emb.mcr2.export_with_head import export_compressed_model

    torch.manual_seed(0)
    head = CompressionHead(32, 8, hidden_dims=(16,), activation="gelu")
    directory = tmp_path_factory.mktemp("onnx") / "head_model"
    export_compressed_model(directory, tiny_bert_path, head, "mean", MAX_SEQ_LENGTH)
    export_onnx(directory)
    return str(directory)


def test_the_graph_holds_every_module_and_the_head_sets_its_dimension(head_model):
    info = read_export_info(head_model)
    assert info["modules"] == [
        "Transformer",
        "Pooling(mean)",
        "Dense 32→16 GELU",
        "Dense 16→8",
        "Normalize",
    ]
    assert info["dimension"] == 8 and info["max_seq_length"] == MAX_SEQ_LENGTH
    for variant in ("fp32", "int8"):
        embedder = OnnxEmbedder(head_model, variant)
        (output,) = embedder.session.get_outputs()
        assert output.shape[1] == 8
        vectors = embedder.embed(["A man is playing a guitar.", "Two dogs run."])
        assert vectors.shape == (2, 8) and vectors.dtype == np.float32
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)


def test_the_graph_s_tokenizer_gives_transformers_ids(head_model):
    """SavedTokenizer (tokenizers on the saved tokenizer.json) against transformers' own
    tokenizer of the same folder: the same ids, masks and types, cut where transformers cuts."""
    from transformers import AutoTokenizer

    data = read_stsb("dev", max_pairs=100)
    texts = [*data.sentences1, "word " * 600, "Ünïcödé\tand 漢字 😀", ""]
    folder = Path(head_model) / "onnx" / "tokenizer"
    ours, theirs = SavedTokenizer(folder), AutoTokenizer.from_pretrained(str(folder))
    assert ours.pad_token_id == theirs.pad_token_id and ours.padding_side == theirs.padding_side
    for length in (MAX_SEQ_LENGTH, None):
        expected = theirs(texts, truncation="longest_first", max_length=length)
        found = ours(texts, length)
        for name in ("input_ids", "attention_mask", "token_type_ids"):
            assert found[name] == expected[name], (name, length)


def test_serving_a_graph_imports_neither_torch_nor_transformers(head_model):
    """The embed job's graph actors import the shard writer's module and OnnxEmbedder: with no
    torch and no transformers, an actor starts in a fraction of the time."""
    code = (
        "import sys\n"
        "import distributed_emb.vectors.corpus_embedding\n"
        "from distributed_emb.model.onnx_embedder import OnnxEmbedder\n"
        f"OnnxEmbedder({head_model!r}, 'int8').embed(['a sentence'])\n"
        "print(sorted({'torch', 'transformers', 'sentence_transformers'} & set(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_each_variant_embeds_stsb_dev_as_the_torch_model_does(head_model):
    data = read_stsb("dev", max_pairs=100)
    tokenizer = OnnxEmbedder(head_model).tokenizer
    lengths = [len(ids) for ids in tokenizer(data.sentences1, 10_000)["input_ids"]]
    assert max(lengths) > MAX_SEQ_LENGTH  # some sentences are truncated, as torch truncates them

    backends = serving_check(head_model, max_pairs=100)

    fp32, int8 = backends["onnx_fp32"], backends["onnx_int8"]
    assert fp32["sentences"] > 150
    assert fp32["cosine_to_torch_min"] >= 0.999
    assert int8["cosine_to_torch_mean"] >= 0.97
    assert fp32["stsb_dev_spearman"] == pytest.approx(backends["torch"]["stsb_dev_spearman"], 0.01)


def test_batches_of_any_size_and_padding_embed_alike(head_model):
    # One sentence per batch (no padding), and all in one padded batch: the axes are dynamic and
    # a row's vector does not depend on its neighbours.
    sentences = read_stsb("dev", max_pairs=5).sentences1
    one_by_one = OnnxEmbedder(head_model, batch_size=1).embed(sentences)
    together = OnnxEmbedder(head_model, batch_size=64).embed(sentences)
    np.testing.assert_allclose(one_by_one, together, atol=1e-5)


def test_a_module_outside_the_graph_is_refused_and_nothing_is_written(tiny_bert_path, tmp_path):
    from sentence_transformers import SentenceTransformer

    from distributed_emb.model.sentence_transformer import _st_modules

    modules = _st_modules()
    transformer = modules.Transformer(tiny_bert_path, max_seq_length=MAX_SEQ_LENGTH)
    lstm = modules.LSTM(word_embedding_dimension=32, hidden_dim=8)
    model = SentenceTransformer(modules=[transformer, lstm, modules.Pooling(16)], device="cpu")
    model.save(str(tmp_path / "lstm"))

    with pytest.raises(UnexportableModelError, match=r"module 1 \(.*LSTM\) cannot be put"):
        export_onnx(tmp_path / "lstm")
    assert not (tmp_path / "lstm" / "onnx").exists()
    with pytest.raises(UnexportableModelError, match="no modules.json"):
        export_onnx(tiny_bert_path)  # a plain HF directory: no modules to read


def test_the_job_replaces_an_earlier_export_and_records_the_check(head_model, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(head_model, copy)
    status = run_job("export_onnx", [str(copy), "--variants", "int8", "onnx.stsb_pairs=20"])
    assert status == 0
    info = json.loads((copy / "onnx" / "export.json").read_text())
    assert list(info["variants"]) == ["int8"] and info["check_passed"]
    assert sorted(info["backends"]) == ["onnx_int8", "torch"]
    assert info["backends"]["onnx_int8"]["pairs"] == 20
    assert not (copy / "onnx" / "model.onnx").exists()  # the earlier fp32 graph went with it

    (copy / "onnx" / "export.json").unlink()  # an onnx/ folder this export did not write
    assert run_job("export_onnx", [str(copy)]) == 2


@pytest.mark.slow
def test_minilm_graphs_agree_with_torch_on_stsb_dev(minilm_path, tmp_path):
    model = tmp_path / "minilm"
    shutil.copytree(minilm_path, model)  # the installed package's directory stays untouched
    info = export_onnx(model)
    assert info["modules"] == ["Transformer", "Pooling(mean)", "Normalize"]

    backends = serving_check(model, max_pairs=150)

    torch_spearman = backends["torch"]["stsb_dev_spearman"]
    assert backends["onnx_fp32"]["cosine_to_torch_min"] >= 0.999
    assert backends["onnx_int8"]["cosine_to_torch_mean"] >= 0.97
    assert backends["onnx_int8"]["stsb_dev_spearman"] == pytest.approx(torch_spearman, abs=1.0)
