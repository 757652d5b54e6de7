"""Export a trained encoder as a sentence-transformers directory.

The directory holds Transformer → Pooling [→ Dense (the checkpoint's pooler, for `cls`)]
[→ Dense (the SimCSE MLP, only when mlp_head == "export")] [→ Normalize, when the starting
model had one]; with an MCR² compression head, its Dense layers and a Normalize follow the
pooling instead, so `SentenceTransformer(path)` computes exactly `model/embedder.py`
`embed_module` (L2-normalised in the last cases; checked by tests/model/test_export.py and
tests/train/test_mcr2_finetune.py).

The export keeps the given model's prompts (its config_sentence_transformers.json `prompts` and
`default_prompt_name`): an E5- or BGE-style model trained here still embeds a query with its
query prompt and a passage with its document prompt, as the model it started from did.

With a `ModelCardInfo` (model/model_card.py) the directory's README.md is a filled model card:
base model, licence, corpus, method and objective, hyperparameters, STS-B scores, command.
"""

from __future__ import annotations

import tempfile

import torch

from distributed_emb.atomic_files import staged_directory
from distributed_emb.model.encoder import TrainableEncoder
from distributed_emb.model.model_card import (
    ModelCardInfo,
    add_eval_results,
    card_data,
    write_readme,
)
from distributed_emb.model.model_config import read_saved_prompts
from distributed_emb.model.sentence_transformer import (
    _st_modules,
    dense_module,
    hf_pooler_dense,
    pooling_module,
)


def export_sentence_transformer(
    encoder: TrainableEncoder,
    tokenizer,
    output_dir: str,
    max_seq_length: int,
    include_mlp: bool = False,
    normalize: bool = False,
    card: ModelCardInfo | None = None,
    prompts_from: str | None = None,
) -> str:
    """`max_seq_length`: the export's (see model_card.export_max_seq_length: the base model's,
    not the training length). `normalize`: end with a Normalize module (unit-length
    embeddings), for a model trained from one that had it, so the export keeps its starting
    model's output contract. `card`: what the README.md says (None: sentence-transformers'
    bare card). `prompts_from`: the model whose prompts the export keeps (None: the one the
    encoder was built from, `encoder.model_path`; a plain Hugging Face model has none)."""
    from sentence_transformers import SentenceTransformer  # startup

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
        head = encoder.compression_head
        if head is not None:  # the same stack as mcr2/export_with_head.py's frozen-encoder export
            stack += [dense_module(linear, act) for linear, act in head.layers_for_export()]
        if normalize or head is not None:  # the head's output is unit length
            stack.append(modules.Normalize())
        prompts, default_prompt_name = read_saved_prompts(prompts_from or encoder.model_path)
        model = SentenceTransformer(
            modules=stack,
            device="cpu",
            prompts=prompts,
            default_prompt_name=default_prompt_name,
            model_card_data=card_data(card) if card else None,
        )
        if card is not None:
            add_eval_results(model, card)
        # Saved into a sibling and swapped in whole: a crash mid-save leaves the previous
        # export (or none), never weights without modules.json.
        with staged_directory(output_dir) as staged:
            model.save(str(staged), create_model_card=card is None)
            if card is not None:
                write_readme(model, staged, card)
    return output_dir
