"""The encoder's settings (`model.*`) and the check that a model path is one, before Ray."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from distributed_emb.checks import ConfigError
from distributed_emb.checks import require as _require
from distributed_emb.settings import section


@section
class ModelConfig:
    path: Annotated[
        str | None,
        Field(
            description="the encoder to start from: a Hugging Face or sentence-transformers "
            "directory (local or s3://), or a hub name; null: the packaged all-MiniLM-L6-v2"
        ),
    ] = None
    pooler: Annotated[
        Literal["cls", "cls_before_pooler", "mean"],
        Field(
            description="the sentence vector: mean of tokens, [CLS] through the pooler, or raw "
            "[CLS]"
        ),
    ] = "mean"
    mlp_head: Annotated[
        Literal["train_only", "export", "none"],
        Field(
            description="SimCSE's MLP (dense + tanh) over the pooled vector: during training "
            "only, also exported, or not at all"
        ),
    ] = "train_only"
    max_seq_length: Annotated[
        int, Field(ge=4, description="tokens per sentence in training (longer ones are cut)")
    ] = 32
    trust_remote_code: Annotated[
        bool, Field(description="allow a model directory's own Python code (custom models)")
    ] = False
    compression_head: Annotated[
        str | None,
        Field(
            description="an MCR² compression head (a models/mcr2-<dim> directory of "
            "jobs/train_mcr2.py) to fine-tune end to end with the encoder; the encoder's "
            "vectors pass through it in training, selection and the export"
        ),
    ] = None

    def local_path(self) -> str:
        """The encoder to start from, as a directory this process can open (a model on object
        storage is copied to the node once: storage.local_model_dir)."""
        from distributed_emb.paths import default_model_path
        from distributed_emb.storage import local_model_dir

        return local_model_dir(self.path or default_model_path())


def looks_like_hub_name(text: str) -> bool:
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", text) is not None


def require_model_dir(path: str | None, key: str) -> None:
    """A model path must be a hub name ('org/model') or an existing model directory.

    Checked here, before Ray starts: a corpus file or an empty directory given as the model
    otherwise fails minutes later inside a Ray worker with a transformers traceback.
    """
    if path is None or "://" in path:  # on object storage: read where it is used
        return
    local = Path(path)
    if not local.exists():
        _require(
            looks_like_hub_name(path),
            key,
            f"{path!r} is not an existing directory (nor a hub name like 'org/model')",
        )
        return
    _require(
        local.is_dir(),
        key,
        f"{path} is a file, not a model directory (expected a directory with config.json, "
        "or modules.json for a sentence-transformers model)",
    )
    _require(
        (local / "config.json").is_file() or (local / "modules.json").is_file(),
        key,
        f"{path} is not a model directory: it has neither config.json (Hugging Face) "
        "nor modules.json (sentence-transformers)",
    )
    for name in ("config.json", "modules.json"):
        # Read by every worker that loads the model: a broken one fails here, not in them.
        if (local / name).is_file():
            try:
                json.loads((local / name).read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as error:
                raise ConfigError(f"{key}: {local / name} is not valid JSON ({error})") from None
