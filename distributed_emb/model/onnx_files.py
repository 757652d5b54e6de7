"""The files an ONNX export writes into ``MODEL_DIR/onnx/`` (model/onnx_export.py) and the
reading of its ``export.json``: apart from the exporter, so that what serves a graph
(model/onnx_embedder.py, the embed job's graph actors) imports neither torch nor transformers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from distributed_emb.atomic_files import write_text_atomic
from distributed_emb.errors import UserInputError

ONNX_DIR = "onnx"
EXPORT_INFO_FILE = "export.json"
TOKENIZER_DIR = "tokenizer"
VARIANT_FILES = {"fp32": "model.onnx", "int8": "model_qint8.onnx"}
# export.json's "exporter": a folder this project's exporter wrote (another tool's is not read).
EXPORTER = "distributed_emb.model.onnx_export"


def read_export_info(model_dir: str | os.PathLike) -> dict:
    """The onnx/export.json of `model_dir`; UserInputError when it has no export."""
    path = Path(model_dir) / ONNX_DIR / EXPORT_INFO_FILE
    if not path.is_file():
        raise UserInputError(
            f"{path} is missing: export the model first (python jobs/export_onnx.py {model_dir})"
        )
    return json.loads(path.read_text())


def write_export_info(model_dir: str | os.PathLike, info: dict) -> Path:
    """Replace the onnx/export.json of `model_dir` with `info` (e.g. with the check's numbers)."""
    path = Path(model_dir) / ONNX_DIR / EXPORT_INFO_FILE
    write_text_atomic(path, json.dumps(info, indent=1) + "\n")
    return path
