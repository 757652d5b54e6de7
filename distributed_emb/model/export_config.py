"""The exported model's settings (`export.*`), checked before hours of training."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Annotated, Literal

from pydantic import Field

from distributed_emb.checks import require as _require
from distributed_emb.model.model_config import looks_like_hub_name
from distributed_emb.settings import section


@section
class ExportConfig:
    # model.max_seq_length is the training length, a speed choice, not what users of the export
    # should get.
    max_seq_length: Annotated[
        int | None,
        Field(ge=4, description="the exported model's max_seq_length; null: the base model's own"),
    ] = None
    push_to_hub: Annotated[
        bool,
        Field(description="upload the export after training (needs HF_HUB_OFFLINE=0 and a token)"),
    ] = False
    hub_model_id: Annotated[
        str | None, Field(description="the hub repository, e.g. my-org/informin-minilm")
    ] = None
    license: Annotated[
        str | None, Field(description="the model card's licence; null: the base model card's")
    ] = None
    # model/onnx_export.py: one graph of every module (a head is never dropped), checked
    # against the torch model on STS-B dev; metrics.json "backends" and the card record it.
    backends: Annotated[
        list[Literal["onnx", "onnx_int8"]],
        Field(
            description="also export these serving backends into <model>/onnx/: onnx (fp32) "
            "and onnx_int8 (int8 weights), each with its cosine agreement with the torch "
            "model and STS-B dev (needs pip install -e '.[onnx]')"
        ),
    ] = dataclasses.field(default_factory=list)


def validate_export_config(c: ExportConfig, key: str = "export") -> None:
    """The hub id's form, and the hub being reachable at all: a push that can only fail must
    fail here, before hours of training, not after them."""
    if c.hub_model_id is not None:
        _require(
            looks_like_hub_name(c.hub_model_id),
            f"{key}.hub_model_id",
            f"{c.hub_model_id!r} is not a hub repository id like 'my-org/my-model'",
        )
    if c.backends:
        _require(
            importlib.util.find_spec("onnxruntime") is not None
            and importlib.util.find_spec("onnx") is not None,
            f"{key}.backends",
            f"{c.backends} needs onnx and onnxruntime: pip install -e '.[onnx]'",
        )
    if c.push_to_hub:
        _require(
            c.hub_model_id is not None,
            f"{key}.hub_model_id",
            f"must be set when {key}.push_to_hub is true (e.g. my-org/informin-minilm)",
        )
        _require(
            os.environ.get("HF_HUB_OFFLINE", "0").strip().lower() in ("0", "false", "no", ""),
            f"{key}.push_to_hub",
            "the hub is off (HF_HUB_OFFLINE=1 in the environment); run with HF_HUB_OFFLINE=0 "
            "and a token (HF_TOKEN or `hf auth login`), or drop export.push_to_hub",
        )
