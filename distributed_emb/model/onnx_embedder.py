"""Inference from an exported ONNX graph: sentences in, embeddings out, with onnxruntime.

:class:`OnnxEmbedder` reads what ``model/onnx_export.py`` wrote into ``MODEL_DIR/onnx/``: the
graph of one variant, the tokenizer the SentenceTransformer uses and its max_seq_length. Its
``embed`` is :class:`~distributed_emb.model.embedder.Embedder`'s: a list of sentences in,
(n, d) float32 out in the same order, tokenised as ``SentenceTransformer.encode`` tokenises
(padding to the batch's longest, truncation at max_seq_length).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from distributed_emb.errors import UserInputError
from distributed_emb.model.onnx_export import ONNX_DIR, read_export_info


class OnnxEmbedder:
    """One exported graph (`variant` "fp32" or "int8") of the model in `model_dir`.

    `threads`: onnxruntime's intra-op threads (None: its default, every physical core).
    `providers`: onnxruntime execution providers, in order of preference.
    """

    def __init__(
        self,
        model_dir: str | os.PathLike,
        variant: str = "fp32",
        batch_size: int = 128,
        threads: int | None = None,
        providers: Sequence[str] = ("CPUExecutionProvider",),
    ) -> None:
        import onnxruntime  # startup
        from transformers import AutoTokenizer  # startup

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
        self.max_seq_length: int | None = info["max_seq_length"]
        self.dimension = int(info["dimension"])
        options = onnxruntime.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        self.session = onnxruntime.InferenceSession(
            str(self.path), options, providers=list(providers)
        )
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.tokenizer = AutoTokenizer.from_pretrained(str(onnx_dir / info["tokenizer"]))

    def embed(self, sentences: Sequence[str]) -> np.ndarray:
        """(n, d) float32 embeddings of `sentences`, in order."""
        sentences = [str(s) for s in sentences]
        # Longest first, as SentenceTransformer.encode does: each batch pads little.
        order = np.argsort([-len(s) for s in sentences], kind="stable")
        chunks = []
        for start in range(0, len(sentences), self.batch_size):
            texts = [sentences[i] for i in order[start : start + self.batch_size]]
            encoded = self.tokenizer(
                texts,
                padding=True,
                truncation="longest_first",
                max_length=self.max_seq_length,
                return_tensors="np",
            )
            feed = {name: encoded[name].astype(np.int64) for name in self.input_names}
            (embeddings,) = self.session.run(None, feed)  # (B, d)
            chunks.append(embeddings)
        if not chunks:
            return np.zeros((0, self.dimension), dtype=np.float32)
        result = np.empty((len(sentences), self.dimension), dtype=np.float32)
        result[order] = np.concatenate(chunks)
        return result
