"""The exported model's settings (`export.*`), checked before hours of training."""

from __future__ import annotations

import os
from typing import Annotated

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


def validate_export_config(c: ExportConfig, key: str = "export") -> None:
    """The hub id's form, and the hub being reachable at all: a push that can only fail must
    fail here, before hours of training, not after them."""
    if c.hub_model_id is not None:
        _require(
            looks_like_hub_name(c.hub_model_id),
            f"{key}.hub_model_id",
            f"{c.hub_model_id!r} is not a hub repository id like 'my-org/my-model'",
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
            "the hub is off (HF_HUB_OFFLINE=1, our jobs' default); run with HF_HUB_OFFLINE=0 "
            "and a token (HF_TOKEN or `hf auth login`), or drop export.push_to_hub",
        )
