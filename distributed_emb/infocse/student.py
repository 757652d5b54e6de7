"""A student built offline: a model's first k transformer layers, saved as a model directory.

The "make my encoder smaller and cheaper" case: the packaged all-MiniLM-L6-v2 cut to its
first 3 of 6 layers keeps its embeddings, tokenizer and pooling but loses the sentence-level
quality the top layers carry, which InfoCSE (annotated by the full model, the teacher) has
to win back. Nothing is downloaded or initialised at random: the first k layers are the
source's own, so the cut is deterministic.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from distributed_emb.model.sentence_transformer import load_sentence_transformer

log = logging.getLogger(__name__)


def _layer_list(auto_model) -> torch.nn.ModuleList:
    """The transformer's stack of layers (BERT, RoBERTa, MiniLM, MPNet, ... keep it at
    `encoder.layer`)."""
    encoder = getattr(auto_model, "encoder", None)
    layers = getattr(encoder, "layer", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(
            f"{type(auto_model).__name__} has no encoder.layer list: cannot cut it to k layers"
        )
    return layers


def build_layer_student(
    source: str,
    num_layers: int,
    output_dir: str,
    pooler: str | None = None,
    max_seq_length: int | None = None,
) -> str:
    """Save `source` cut to its first `num_layers` layers to `output_dir`; returns the path.

    `source` is loaded like every model here (a sentence-transformers directory as saved when
    `pooler` is None, else an HF encoder with `pooler` on top), so the student pools and
    normalises exactly as its source does.
    """

    model = load_sentence_transformer(
        source, pooler=pooler, max_seq_length=max_seq_length, device="cpu"
    )
    auto_model = model[0].auto_model
    layers = _layer_list(auto_model)
    if not 1 <= num_layers <= len(layers):
        raise ValueError(f"student.num_layers must be in 1..{len(layers)}, got {num_layers}")
    auto_model.encoder.layer = torch.nn.ModuleList(list(layers)[:num_layers])
    auto_model.config.num_hidden_layers = num_layers
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    model.save(str(output_dir))
    log.info("student: %s cut to %d of %d layers → %s", source, num_layers, len(layers),
             output_dir)  # fmt: skip
    return str(output_dir)
