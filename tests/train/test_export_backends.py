"""export.backends: the training job's export also gets its ONNX graph and int8 variant, each
checked against the torch model, recorded in metrics ("backends") and on the card, with the
modules the graph holds; asked for without onnxruntime, it is refused before Ray starts."""

from __future__ import annotations

import dataclasses
import importlib.util
import shutil

import pytest

from distributed_emb.checks import ConfigError
from distributed_emb.config import TrainingConfig, load_config

pytest.importorskip("onnxruntime")


def test_the_export_gets_each_backend_checked_and_carded(tiny_run, tmp_path):
    from distributed_emb.train.driver import export_backends
    from distributed_emb.train.run_card import finalize_export

    config, result = tiny_run
    model_dir = str(tmp_path / "model")
    shutil.copytree(result.model_dir, model_dir)  # the session's run stays as it was
    config = dataclasses.replace(
        config, export=dataclasses.replace(config.export, backends=["onnx", "onnx_int8"])
    )
    backends = export_backends(model_dir, config)
    assert backends["modules"][0] == "Transformer"
    assert (tmp_path / "model" / "onnx" / "model.onnx").is_file()
    assert backends["onnx_fp32"]["cosine_to_torch_min"] >= 0.999
    assert backends["onnx_int8"]["cosine_to_torch_mean"] >= 0.97
    metrics = {**result.metrics, "backends": backends}
    finalize_export(model_dir, config, metrics, command="python jobs/train_informin.py")
    card = (tmp_path / "model" / "README.md").read_text()
    assert "- **ONNX graph (onnx/):** " + " → ".join(backends["modules"]) in card
    assert "- **ONNX int8 (onnx/model_qint8.onnx):** cosine with the torch model" in card


def test_backends_without_onnxruntime_are_refused_naming_the_key(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name)
    )
    with pytest.raises(ConfigError, match=r"export\.backends: .*pip install"):
        load_config(TrainingConfig, None, ["export.backends=[onnx]"])
