"""Inference from an exported ONNX graph: sentences in, embeddings out, with onnxruntime.

:class:`OnnxEmbedder` reads what ``model/onnx_export.py`` wrote into ``MODEL_DIR/onnx/``: the
graph of one variant, the tokenizer the SentenceTransformer uses and its max_seq_length. Its
``embed`` is :class:`~distributed_emb.model.embedder.Embedder`'s: a list of sentences in,
(n, d) float32 out in the same order, tokenised as ``SentenceTransformer.encode`` tokenises
(padding to the batch's longest, truncation at max_seq_length). A call's texts are tokenised
once and cut into batches longest first by token count, so each batch pads little (the embed
job gives it a whole corpus block at a time).

The tokenizer is the export's ``tokenizer.json`` run by the `tokenizers` library
(:class:`SavedTokenizer`), the same Rust tokenizer transformers' fast tokenizers wrap: the ids
are transformers', and a graph's process imports neither transformers nor torch (the embed
job's actors started 5 s faster; docs/BENCHMARKS.md, "Embedding a corpus").

Prompts are text, not in the graph: ``embed(sentences, role)`` puts before each sentence what
``SentenceTransformer.encode_query`` ("query"), ``encode_document`` ("document") or ``encode``
(None) would, from the model's prompts in ``MODEL_DIR/config_sentence_transformers.json``
(model_config.py :func:`role_prompt`), or `query_prompt` / `document_prompt` when given.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from distributed_emb.errors import UserInputError
from distributed_emb.model.model_config import ROLES, read_saved_prompts, role_prompt
from distributed_emb.model.onnx_files import ONNX_DIR, read_export_info


class OnnxEmbedder:
    """One exported graph (`variant` "fp32" or "int8") of the model in `model_dir`.

    `threads`: onnxruntime's intra-op threads (None: its default, every physical core).
    `providers`: onnxruntime execution providers, in order of preference.
    `query_prompt`, `document_prompt`: the text put before a query or a document instead of
    the model's own ("": none; None: the model's). `max_seq_length`: tokens kept per text
    instead of the export's (the graph's sequence axis is dynamic), as ``embed.max_seq_length``
    cuts a corpus's rows; None: the export's.
    """

    def __init__(
        self,
        model_dir: str | os.PathLike,
        variant: str = "fp32",
        batch_size: int = 128,
        threads: int | None = None,
        providers: Sequence[str] = ("CPUExecutionProvider",),
        query_prompt: str | None = None,
        document_prompt: str | None = None,
        max_seq_length: int | None = None,
    ) -> None:
        import onnxruntime  # startup

        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        info = read_export_info(model_dir)
        onnx_dir = Path(model_dir) / ONNX_DIR
        if variant not in info["variants"]:
            raise UserInputError(
                f"{onnx_dir}: no {variant} graph (exported: {', '.join(info['variants'])}); "
                f"export it with python jobs/export_onnx.py {model_dir} --variants {variant}"
            )
        self.path = onnx_dir / info["variants"][variant]["file"]
        self.variant = variant
        self.batch_size = batch_size
        self.max_seq_length: int | None = max_seq_length or info["max_seq_length"]
        self.dimension = int(info["dimension"])
        self.modules: list[str] = list(info["modules"])  # ["Transformer", "Pooling(mean)", ...]
        options = onnxruntime.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        self.session = onnxruntime.InferenceSession(
            str(self.path), options, providers=list(providers)
        )
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.tokenizer = SavedTokenizer(onnx_dir / info["tokenizer"])
        # The prompts the SentenceTransformer holds when loaded from model_dir.
        self.prompts, self.default_prompt_name = read_saved_prompts(str(model_dir))
        self.prompt_settings = {"query": query_prompt, "document": document_prompt}

    def prompt(self, role: str | None) -> str:
        """The text put before each text embedded as `role` ("" for none): the setting, else
        the model's own prompt (sentence-transformers' choice)."""
        override = self.prompt_settings.get(role or "")
        if override is not None:
            return override
        return role_prompt(self.prompts, self.default_prompt_name, role)

    def embed(self, sentences: Sequence[str], role: str | None = None) -> np.ndarray:
        """(n, d) float32 embeddings of `sentences`, in order, embedded as `role` ("query",
        "document"; None: as ``encode``), each with its prompt put before it."""
        if role is not None and role not in ROLES:
            raise ValueError(f"role must be one of {ROLES} or None, got {role!r}")
        prompt = self.prompt(role)
        texts = [prompt + str(s) for s in sentences]
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        # Tokenised once, then longest first by token count: each batch pads only to its own
        # longest row (SentenceTransformer.encode sorts by characters, which comes close).
        encoded = self.tokenizer(texts, self.max_seq_length)
        lengths = np.array([len(ids) for ids in encoded["input_ids"]])
        order = np.argsort(-lengths, kind="stable")
        chunks = []
        for start in range(0, len(texts), self.batch_size):
            rows = order[start : start + self.batch_size]
            width = int(lengths[rows].max())
            feed = {
                name: self._padded(name, encoded[name], rows, width) for name in self.input_names
            }
            (embeddings,) = self.session.run(None, feed)  # (B, d)
            chunks.append(embeddings)
        result = np.empty((len(texts), self.dimension), dtype=np.float32)
        result[order] = np.concatenate(chunks)
        return result

    def _padded(self, name: str, values: list[list[int]], rows: np.ndarray, width: int):
        """(B, width) int64 of one tokenizer output for `rows`, padded as the tokenizer pads
        (its pad token, a 0 mask and type; on its padding side)."""
        pad = 0
        if name == "input_ids":
            pad = self.tokenizer.pad_token_id or 0
        elif name == "token_type_ids":
            pad = self.tokenizer.pad_token_type_id
        batch = np.full((len(rows), width), pad, dtype=np.int64)
        left = self.tokenizer.padding_side == "left"
        for i, row in enumerate(rows):
            sequence = values[row]
            if left:
                batch[i, width - len(sequence) :] = sequence
            else:
                batch[i, : len(sequence)] = sequence
        return batch


class SavedTokenizer:
    """A saved fast tokenizer's ``tokenizer.json`` through the `tokenizers` library, encoding as
    transformers' ``tokenizer(texts, truncation="longest_first", max_length=n)`` does (special
    tokens added, no padding), with the pad token, padding side and truncation side of its
    ``tokenizer_config.json``. A directory without ``tokenizer.json`` (a tokenizer with no fast
    version) is refused: the export saves the SentenceTransformer's own tokenizer, fast for
    every model sentence-transformers loads by default."""

    def __init__(self, directory: Path) -> None:
        from tokenizers import Tokenizer  # startup

        file = directory / "tokenizer.json"
        if not file.is_file():
            raise UserInputError(
                f"{file} is missing: serving a graph needs the model's fast tokenizer; export "
                "a model whose tokenizer has a fast version"
            )
        config_file = directory / "tokenizer_config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        self.backend = Tokenizer.from_file(str(file))
        self.backend.no_padding()  # each batch is padded to its own longest row by the caller
        self.padding_side = config.get("padding_side", "right")
        self.truncation_side = config.get("truncation_side", "right")
        pad = config.get("pad_token")
        pad = pad.get("content") if isinstance(pad, dict) else pad
        self.pad_token_id = self.backend.token_to_id(pad) if pad else None
        self.pad_token_type_id = 0  # transformers' default; no saved setting changes it
        limit = config.get("model_max_length")
        # transformers writes a huge number for "no limit".
        self.model_max_length = limit if isinstance(limit, int) and limit < 10**9 else None

    def __call__(self, texts: list[str], max_length: int | None) -> dict[str, list[list[int]]]:
        """{input_ids, attention_mask, token_type_ids}: one list of ints per text, unpadded."""
        length = max_length or self.model_max_length
        if length:
            self.backend.enable_truncation(
                length, strategy="longest_first", direction=self.truncation_side
            )
        else:
            self.backend.no_truncation()
        encodings = self.backend.encode_batch(texts, add_special_tokens=True)
        return {
            "input_ids": [e.ids for e in encodings],
            "attention_mask": [e.attention_mask for e in encodings],
            "token_type_ids": [e.type_ids for e in encodings],
        }
