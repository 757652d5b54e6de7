"""Build a SentenceTransformer from any HF or sentence-transformers directory.

One place decides how our pooler names map onto sentence-transformers modules, so the
evaluator, the exporter and the annotation actors all embed a sentence the same way:

- ``mean``: masked mean of the last hidden states.
- ``cls_before_pooler``: the [CLS] token's last hidden state.
- ``cls``: the [CLS] state passed through the checkpoint's own pooler layer (dense + tanh),
  as SimCSE's ``cls`` evaluation does; exported as a ``Dense`` module holding those weights.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from distributed_emb.storage import local_model_dir

if TYPE_CHECKING:
    import torch

POOLERS = ("cls", "cls_before_pooler", "mean")


def _st_modules():
    # sentence-transformers >= 6 moved the modules; older releases keep `models`.
    try:
        from sentence_transformers.sentence_transformer import modules  # version
    except ImportError:  # pragma: no cover - older sentence-transformers
        from sentence_transformers import models as modules  # version
    return modules


def is_sentence_transformer_dir(path: str | os.PathLike) -> bool:
    return (Path(path) / "modules.json").is_file()


def ends_with_normalize(path: str | os.PathLike) -> bool:
    """Does the sentence-transformers dir at `path` L2-normalise its embeddings (a Normalize
    module, as all-MiniLM-L6-v2 has)? False for a plain HF dir."""
    modules = Path(path) / "modules.json"
    if not modules.is_file():
        return False
    entries = json.loads(modules.read_text())
    return any(str(e.get("type", "")).endswith(".Normalize") for e in entries)


def pooling_module(hidden_size: int, pooler: str):
    """The sentence-transformers Pooling module for one of our pooler names."""
    if pooler not in POOLERS:
        raise ValueError(f"unknown pooler {pooler!r}; expected one of {POOLERS}")
    mode = "mean" if pooler == "mean" else "cls"
    return _st_modules().Pooling(hidden_size, pooling_mode=mode)


def dense_module(linear: torch.nn.Linear, activation: torch.nn.Module | None):
    """A sentence-transformers Dense module holding a copy of `linear`'s weights."""
    import torch  # startup

    return _st_modules().Dense(
        linear.in_features,
        linear.out_features,
        bias=linear.bias is not None,
        activation_function=activation if activation is not None else torch.nn.Identity(),
        init_weight=linear.weight.detach().cpu().clone(),
        init_bias=None if linear.bias is None else linear.bias.detach().cpu().clone(),
    )


def hf_pooler_dense(auto_model) -> torch.nn.Linear:
    """The checkpoint's own pooler layer (BERT-style `pooler.dense`), needed by `cls`."""
    pooler = getattr(auto_model, "pooler", None)
    if pooler is None or not hasattr(pooler, "dense"):
        raise ValueError(
            "pooler 'cls' needs the checkpoint's pooler layer (pooler.dense), which this model "
            "lacks; use 'cls_before_pooler' or 'mean'"
        )
    return pooler.dense


def load_sentence_transformer(
    path: str,
    pooler: str | None = None,
    max_seq_length: int | None = None,
    device: str | None = None,
    trust_remote_code: bool = False,
):
    """Load `path` for inference.

    A sentence-transformers directory with no `pooler` given loads as saved (its own pooling,
    dense and normalise modules). Otherwise `path` is read as a plain HF encoder and `pooler`
    (default ``cls_before_pooler``, SimCSE's unsupervised setting) is put on top.
    """
    import torch  # startup
    from sentence_transformers import SentenceTransformer  # startup

    path = local_model_dir(path)  # a model on object storage: this node's copy
    if pooler is None and is_sentence_transformer_dir(path):
        model = SentenceTransformer(path, device=device, trust_remote_code=trust_remote_code)
    else:
        pooler = pooler or "cls_before_pooler"
        modules = _st_modules()
        transformer = modules.Transformer(
            path,
            max_seq_length=max_seq_length,
            model_kwargs={"trust_remote_code": trust_remote_code},
            config_kwargs={"trust_remote_code": trust_remote_code},
        )
        stack = [transformer, pooling_module(transformer.get_embedding_dimension(), pooler)]
        if pooler == "cls":
            stack.append(dense_module(hf_pooler_dense(transformer.auto_model), torch.nn.Tanh()))
        model = SentenceTransformer(modules=stack, device=device)
    if max_seq_length is not None:
        model.max_seq_length = max_seq_length
    return model
