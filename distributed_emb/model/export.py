"""Export a trained encoder as a sentence-transformers directory.

The directory holds Transformer → Pooling [→ Dense (the checkpoint's pooler, for `cls`)]
[→ Dense (the SimCSE MLP, only when mlp_head == "export")] [→ Normalize, when the starting
model had one], so `SentenceTransformer(path)` computes exactly `SentenceEncoder.encode`
(L2-normalised in the last case; checked by tests/model/test_export.py).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from distributed_emb.model.encoder import SentenceEncoder
from distributed_emb.model.sentence_transformer import (
    _st_modules,
    dense_module,
    hf_pooler_dense,
    pooling_module,
)


def export_sentence_transformer(
    encoder: SentenceEncoder,
    tokenizer,
    output_dir: str,
    max_seq_length: int,
    include_mlp: bool = False,
    normalize: bool = False,
) -> str:
    """`normalize`: end with a Normalize module (unit-length embeddings), for a model trained
    from one that had it, so the export keeps its starting model's output contract."""
    from sentence_transformers import SentenceTransformer

    modules = _st_modules()
    with tempfile.TemporaryDirectory() as staging:
        encoder.backbone.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        transformer = modules.Transformer(staging, max_seq_length=max_seq_length)
        stack = [transformer, pooling_module(encoder.hidden_size, encoder.pooler)]
        if encoder.pooler == "cls":
            stack.append(dense_module(hf_pooler_dense(encoder.backbone), torch.nn.Tanh()))
        if include_mlp and encoder.mlp is not None:
            stack.append(dense_module(encoder.mlp[0], torch.nn.Tanh()))
        if normalize:
            stack.append(modules.Normalize())
        model = SentenceTransformer(modules=stack, device="cpu")
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        model.save(output_dir)
    return output_dir
