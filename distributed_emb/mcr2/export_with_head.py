"""Encoder + trained compression head as one SentenceTransformer directory.

The stack is the encoder's own modules (Transformer, Pooling, and its Dense/Normalize if it
had any), then one ``Dense`` per head layer (the hidden activation inside each Dense, identity
on the last) and ``Normalize``. Only stock sentence-transformers modules are used, so
``SentenceTransformer(path)`` loads the result without this package installed.
"""

from __future__ import annotations

import os
from pathlib import Path

from distributed_emb.model.compression_head import CompressionHead, save_head
from distributed_emb.model.sentence_transformer import (
    _st_modules,
    dense_module,
    load_sentence_transformer,
)


def compressed_sentence_transformer(
    encoder_path: str,
    head: CompressionHead,
    pooler: str | None = "mean",
    max_seq_length: int | None = None,
):
    """A SentenceTransformer: the encoder as loaded for training, then the head's layers."""
    from sentence_transformers import SentenceTransformer  # startup

    encoder = load_sentence_transformer(
        encoder_path, pooler=pooler, max_seq_length=max_seq_length, device="cpu"
    )
    modules = _st_modules()
    stack = list(encoder)  # Transformer, Pooling[, Dense…][, Normalize]
    stack += [dense_module(linear, activation) for linear, activation in head.layers_for_export()]
    stack.append(modules.Normalize())
    model = SentenceTransformer(modules=stack, device="cpu")
    model.max_seq_length = encoder.max_seq_length
    return model


def export_compressed_model(
    output_dir: str | os.PathLike,
    encoder_path: str,
    head: CompressionHead,
    pooler: str | None = "mean",
    max_seq_length: int | None = None,
    metadata: dict | None = None,
) -> Path:
    """Write encoder + head to `output_dir` (a SentenceTransformer directory) and return it.

    `metadata` (e.g. the head's STS-B dev score and training config) is saved alongside as
    ``mcr2_head.json``, and the head's weights as ``compression_head.safetensors``
    (``model.compression_head`` of an end-to-end fine-tuning run starts from them);
    sentence-transformers ignores both.
    """
    output_dir = Path(output_dir)
    model = compressed_sentence_transformer(encoder_path, head, pooler, max_seq_length)
    model.save(str(output_dir))
    info = {
        "encoder": str(encoder_path),
        "pooler": pooler,
        "output_dim": head.output_dim,
        "hidden_dims": [linear.out_features for linear in head.linears[:-1]],
        "activation": head.activation_name,
        **(metadata or {}),
    }
    save_head(head, output_dir, info)
    return output_dir
