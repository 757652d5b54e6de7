"""Inference: sentences in, embeddings out — the one path every caller embeds through.

:class:`Embedder` holds a saved model (any sentence-transformers or HF directory, loaded by
:func:`~distributed_emb.model.sentence_transformer.load_sentence_transformer`, so every
caller embeds a sentence the same way). It is the callable class given to
``Dataset.map_batches`` (each actor loads the model once, then embeds batch after batch) and
the in-process embedder. The evaluator, the InfoCSE annotator and its round scoring, the
MCR² tools, the corpus embedding job and the STS-B test of an export all use it.
:func:`embed_module` embeds with the module being trained (in-training STS-B dev), exactly as
its export will.

:func:`encoding_pool` is the one actor pool every Ray encoding runs on: a dataset in, the same
dataset with an embedding column (or whatever an Embedder subclass returns) out.
:func:`ray_encode` wraps it into "list of sentences in, (n, d) array out, same order"; the
corpus embedding job (vectors/corpus_embedding.py) gives it corpus blocks to write as shards.
Ray Data does not promise to keep row order across an actor pool, so each row carries its
input index and the output is put back in order by it.

Prompts: ``embed(sentences, role)`` embeds queries (`role` "query") and documents ("document")
as sentence-transformers' ``encode_query`` / ``encode_document`` do, with the model's own
prompts (model_config.py :func:`role_prompt`) unless `query_prompt` / `document_prompt`
(settings `prompts.*`) say otherwise; no role is ``encode`` (its default prompt, if any), for
the symmetric tasks (STS, transfer, training's evaluation). :class:`RoleEncoders` gives an
evaluation the three encoders at once.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray

from distributed_emb.model.compute_dtype import (
    check_bfloat16,
    computing_in,
    resolve_compute_dtype,
    settle_after_check,
)
from distributed_emb.model.model_config import ROLES, role_prompt
from distributed_emb.model.sentence_transformer import load_sentence_transformer
from distributed_emb.progress_report import Progress
from distributed_emb.resource_plan import Extra, check_pool_plan
from distributed_emb.watchdog import DEFAULT_STALL_TIMEOUT_S, no_silent_stall

INDEX_COLUMN = "__index"
# Embedder.embed on a long list reports progress every this many batches.
BATCHES_PER_PROGRESS_STEP = 32
EMBEDDING_COLUMN = "embedding"


class Embedder:
    """A saved model for inference; as a callable class for ``ray.data.Dataset.map_batches``
    it adds an embedding column.

    Input batches are dicts of numpy arrays (``batch_format="numpy"``) with a text column;
    the output batch is the input plus ``output_column`` holding a (B, d) float32 array.
    `embed_as`: the role ("query", "document") :meth:`embed` and the batches embed texts as
    when none is given (None: plain ``encode``). `query_prompt`, `document_prompt`: the text
    put before a query or a document instead of the model's own ("": none; None: the model's).
    `compute_dtype`: what the forward passes multiply in (model/compute_dtype.py: "float32",
    "bfloat16", or "auto": bfloat16 on a CPU with AMX); bfloat16 is checked against float32 on
    the first texts embedded, and `precision_check` holds the figures.
    """

    def __init__(
        self,
        model_path: str,
        pooler: str | None = None,
        batch_size: int = 128,
        max_seq_length: int | None = None,
        text_column: str = "text",
        output_column: str = EMBEDDING_COLUMN,
        device: str | None = None,
        torch_threads: int | None = None,
        normalize: bool = False,
        trust_remote_code: bool = False,
        embed_as: str | None = None,
        query_prompt: str | None = None,
        document_prompt: str | None = None,
        compute_dtype: str = "float32",
    ) -> None:
        if embed_as is not None and embed_as not in ROLES:
            raise ValueError(f"embed_as must be one of {ROLES} or None, got {embed_as!r}")
        import torch  # startup: a graph's actor (vectors/embed_backend.py) imports this module

        if torch_threads is not None:
            # Ray sets OMP threads from the actor's (possibly fractional) CPU share; an
            # explicit count lets one actor use the whole machine when it is alone on it.
            torch.set_num_threads(torch_threads)
        self.model = load_sentence_transformer(
            model_path,
            pooler=pooler,
            max_seq_length=max_seq_length,
            device=device,
            trust_remote_code=trust_remote_code,
        )
        self.batch_size = batch_size
        self.text_column = text_column
        self.output_column = output_column
        self.normalize = normalize
        self.embed_as = embed_as
        self.prompt_settings = {"query": query_prompt, "document": document_prompt}
        self.requested_dtype = compute_dtype
        self.compute_dtype = resolve_compute_dtype(compute_dtype, self.model.device.type)
        self.precision_check = None  # model/compute_dtype.py PrecisionCheck, once checked

    def prompt(self, role: str | None) -> str:
        """The text put before each text embedded as `role` ("" for none): the setting, else
        what the model's own prompts give (sentence-transformers' choice)."""
        override = self.prompt_settings.get(role or "")
        if override is not None:
            return override
        return role_prompt(self.model.prompts, self.model.default_prompt_name, role)

    @property
    def normalizes(self) -> bool:
        """Are the vectors unit length: L2-normalised here, or by the model's own Normalize
        module (all-MiniLM-L6-v2 has one)?"""
        return self.normalize or any(type(m).__name__ == "Normalize" for m in self.model)

    @property
    def dimension(self) -> int:
        return int(self.model.get_embedding_dimension())

    def embed(self, sentences: Sequence[str], role: str | None = None) -> np.ndarray:
        """(n, d) float32 embeddings of `sentences`, in order, embedded as `role`: "query"
        (``encode_query``), "document" (``encode_document``), each with :meth:`prompt`; None:
        the embedder's `embed_as`, and with none either plain ``encode``."""
        role = role or self.embed_as
        options = {
            "batch_size": self.batch_size,
            "convert_to_numpy": True,
            "show_progress_bar": False,
            "normalize_embeddings": self.normalize,
        }
        if role is None:
            encode = self.model.encode
        elif role in ROLES:
            # The prompt given explicitly ("" for none): sentence-transformers then prepends
            # exactly it; the method still tells a Router model which route to take.
            method = self.model.encode_query if role == "query" else self.model.encode_document
            options["prompt"] = self.prompt(role)
            encode = method
        else:
            raise ValueError(f"role must be one of {ROLES} or None, got {role!r}")
        sentences = list(sentences)
        if self.compute_dtype == "bfloat16" and self.precision_check is None and sentences:
            self._check_bfloat16(encode, options, sentences)
        with computing_in(self.compute_dtype, self.model.device.type):
            return self._encode_in_order(encode, options, sentences)

    def _check_bfloat16(self, encode: Callable, options: dict, sentences: list[str]) -> None:
        """Compare bfloat16 with float32 on the first texts (model/compute_dtype.py) and
        settle the dtype: float32 from here on if `auto`'s bfloat16 failed the check."""

        def embed_in(dtype: str, texts: list[str]) -> np.ndarray:
            with computing_in(dtype, self.model.device.type):
                return encode(texts, **options)

        self.precision_check = check_bfloat16(embed_in, sentences)
        self.compute_dtype = settle_after_check(self.requested_dtype, self.precision_check)

    def _encode_in_order(self, encode: Callable, options: dict, sentences: list[str]):
        """`encode` over `sentences`, (n, d) float32 in their order; a long list in chunks,
        with progress."""
        chunk = self.batch_size * BATCHES_PER_PROGRESS_STEP
        if len(sentences) <= chunk:  # a Ray Data batch, a small set: one call
            embeddings = encode(sentences, **options)
            return np.asarray(embeddings, dtype=np.float32).reshape(len(sentences), -1)
        # A long list in chunks, so that its progress shows. Cut in encode's own order (longest
        # first) and in whole batches: each chunk's batches are the ones a single call makes.
        order = np.argsort([-len(s) for s in sentences], kind="stable")
        rows, pieces = [], []
        with Progress("encode", len(sentences), "sentences") as done:
            for start in range(0, len(order), chunk):
                rows.append(order[start : start + chunk])
                pieces.append(encode([sentences[i] for i in rows[-1]], **options))
                done.update(len(rows[-1]))
        out = np.empty((len(sentences), np.asarray(pieces[0]).shape[-1]), dtype=np.float32)
        for chunk_rows, piece in zip(rows, pieces, strict=True):
            out[chunk_rows] = np.asarray(piece, dtype=np.float32).reshape(len(chunk_rows), -1)
        return out

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.text_column not in batch:
            raise KeyError(
                f"batch has no text column {self.text_column!r}; columns: {sorted(batch)}"
            )
        sentences = [str(s) for s in batch[self.text_column]]
        out = dict(batch)
        out[self.output_column] = self.embed(sentences)  # (B, d)
        return out


def local_encode(
    sentences: Sequence[str],
    model_path: str,
    pooler: str | None = None,
    batch_size: int = 128,
    max_seq_length: int | None = None,
    device: str | None = None,
) -> np.ndarray:
    """In-process encoding (no Ray): the same model and batching as one actor would use."""
    embedder = Embedder(
        model_path,
        pooler=pooler,
        batch_size=batch_size,
        max_seq_length=max_seq_length,
        device=device,
    )
    return embedder.embed(sentences)


def embed_module(
    module,
    tokenizer,
    sentences: list[str],
    max_seq_length: int,
    batch_size: int = 128,
    include_mlp: bool = False,
) -> np.ndarray:
    """(n, d) embeddings from the module being trained (model/encoder.py TrainableEncoder), as
    its export computes them: no dropout, no training MLP unless it is exported. Sorted by
    length so padding is minimal; rows come back in input order."""
    import torch  # startup

    was_training = module.training
    module.eval()
    device = next(module.parameters()).device
    order = np.argsort([-len(s) for s in sentences], kind="stable")
    chunks = []
    with torch.no_grad():
        for start in range(0, len(sentences), batch_size):
            texts = [sentences[i] for i in order[start : start + batch_size]]
            batch = tokenizer(
                texts, padding=True, truncation=True, max_length=max_seq_length, return_tensors="pt"
            ).to(device)
            pooled = module(batch["input_ids"], batch["attention_mask"], use_mlp=include_mlp)
            chunks.append(pooled.float().cpu())
    module.train(was_training)
    embeddings = torch.cat(chunks).numpy() if chunks else np.zeros((0, module.hidden_size))
    result = np.empty_like(embeddings)
    result[order] = embeddings
    return result


def default_cpus_per_actor(concurrency: int, cluster_cpus: float) -> float:
    """CPUs per encoding actor that leave one CPU for Ray Data's own tasks.

    On a 2-CPU machine an actor pool that takes every CPU starves the read tasks and hangs
    (read tasks get no CPU); fractional shares avoid it. Capped at 1 and floored at 0.25.
    """
    spare = max(cluster_cpus - 1.0, 0.25 * concurrency)
    return max(0.25, min(1.0, spare / concurrency))


def encoding_pool(
    dataset: ray.data.Dataset,
    model_path: str,
    pooler: str | None = None,
    batch_size: int = 128,
    max_seq_length: int | None = None,
    concurrency: int = 1,
    num_cpus_per_actor: float | None = None,
    num_gpus_per_actor: float | None = None,
    torch_threads: int | None = None,
    normalize: bool = False,
    trust_remote_code: bool = False,
    text_column: str = "text",
    rows_per_call: int | None = None,
    batch_format: str = "numpy",
    embedder_class: type[Embedder] = Embedder,
    embedder_kwargs: dict[str, Any] | None = None,
    max_restarts: int | None = None,
    max_tasks_in_flight_per_actor: int | None = None,
    role: str = "encoding actors",
    fix: str = "the encoder's concurrency or num_cpus_per_actor",
    embed_as: str | None = None,
    query_prompt: str | None = None,
    document_prompt: str | None = None,
) -> ray.data.Dataset:
    """`dataset` through a pool of `concurrency` encoding actors: each loads the model once
    (`embedder_class`, an :class:`Embedder` or a subclass given `embedder_kwargs` besides the
    model's), then takes `rows_per_call` rows a call (default `batch_size`; None: a whole
    block) and returns what the class returns: the rows plus an embedding column for
    :class:`Embedder`. Lazy: nothing runs until the result is consumed.

    `num_cpus_per_actor` defaults to a share that leaves one CPU free
    (:func:`default_cpus_per_actor`); `num_gpus_per_actor` to 1 when the cluster has at least
    `concurrency` GPUs, else 0. A pool that can never fit fails here (PlanError).
    `max_restarts`: how often a dead actor (killed, out of memory, its node lost) is restarted
    with its unfinished calls retried on it; None keeps Ray Data's default (without end).
    `max_tasks_in_flight_per_actor`: calls queued on one actor (None: Ray Data's default); a
    small queue keeps few large calls from piling onto the first actor up.
    `role` and `fix` name the pool and the settings that size it in a plan error.
    `embed_as`, `query_prompt`, `document_prompt`: each actor's :class:`Embedder` settings
    (the rows embedded as queries or documents, and the prompts)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if not ray.is_initialized():
        ray.init()
    resources = ray.cluster_resources()
    if num_cpus_per_actor is None:
        num_cpus_per_actor = default_cpus_per_actor(concurrency, resources.get("CPU", 1.0))
    if num_gpus_per_actor is None:
        num_gpus_per_actor = 1.0 if resources.get("GPU", 0.0) >= concurrency else 0.0
    check_pool_plan(Extra(role, concurrency, num_cpus_per_actor, num_gpus_per_actor), fix=fix)
    restarts = {}
    if max_restarts is not None:
        restarts = {"max_restarts": max_restarts, "max_task_retries": max_restarts}
    with warnings.catch_warnings():
        # Ray 2.60 names no parameter for an actor's restarts yet and warns about the remote
        # args it still reads them from; the warning says nothing the user can act on.
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
        return dataset.map_batches(
            embedder_class,
            fn_constructor_kwargs={
                "model_path": model_path,
                "pooler": pooler,
                "batch_size": batch_size,
                "max_seq_length": max_seq_length,
                "text_column": text_column,
                "output_column": EMBEDDING_COLUMN,
                "torch_threads": torch_threads,
                "normalize": normalize,
                "trust_remote_code": trust_remote_code,
                "embed_as": embed_as,
                "query_prompt": query_prompt,
                "document_prompt": document_prompt,
                **(embedder_kwargs or {}),
            },
            batch_size=batch_size if rows_per_call is None else rows_per_call,
            batch_format=batch_format,
            compute=ray.data.ActorPoolStrategy(
                size=concurrency, max_tasks_in_flight_per_actor=max_tasks_in_flight_per_actor
            ),
            num_cpus=num_cpus_per_actor,
            num_gpus=num_gpus_per_actor,
            **restarts,
        )


def ray_encode(
    sentences: Sequence[str],
    model_path: str,
    pooler: str | None = None,
    batch_size: int = 128,
    max_seq_length: int | None = None,
    concurrency: int = 1,
    num_cpus_per_actor: float | None = None,
    num_gpus_per_actor: float | None = None,
    torch_threads: int | None = None,
    stall_timeout_s: float | None = DEFAULT_STALL_TIMEOUT_S,
    embed_as: str | None = None,
    query_prompt: str | None = None,
    document_prompt: str | None = None,
) -> np.ndarray:
    """Embed `sentences` with a Ray Data actor pool; returns (n, d) float32 in input order.
    `embed_as` ("query", "document", None: plain) and the prompts: :class:`Embedder`'s.

    Uses the running Ray instance (or starts a local one). `num_cpus_per_actor` defaults to
    a share that leaves one CPU free (:func:`default_cpus_per_actor`); `num_gpus_per_actor`
    defaults to 1 when the cluster has at least `concurrency` GPUs, else 0. A pool that can
    never fit fails before it starts (PlanError); one that waits `stall_timeout_s` for
    resources that never free fails naming them (StallError).
    """
    sentences = [str(s) for s in sentences]
    n = len(sentences)
    if n == 0:
        raise ValueError("no sentences to encode")
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if not ray.is_initialized():
        ray.init()

    # Rows sorted by length so each batch pads little; the index column restores the order.
    by_length = sorted(range(n), key=lambda i: len(sentences[i]))
    rows = [{INDEX_COLUMN: i, "text": sentences[i]} for i in by_length]
    num_blocks = max(1, min(math.ceil(n / batch_size), 4 * concurrency))
    dataset = ray.data.from_items(rows, override_num_blocks=num_blocks)
    embedded = encoding_pool(
        dataset,
        model_path,
        pooler=pooler,
        batch_size=batch_size,
        max_seq_length=max_seq_length,
        concurrency=concurrency,
        num_cpus_per_actor=num_cpus_per_actor,
        num_gpus_per_actor=num_gpus_per_actor,
        torch_threads=torch_threads,
        embed_as=embed_as,
        query_prompt=query_prompt,
        document_prompt=document_prompt,
    ).select_columns([INDEX_COLUMN, EMBEDDING_COLUMN])

    indices: list[np.ndarray] = []
    chunks: list[np.ndarray] = []
    hint = "fix: the encoder's concurrency, num_cpus_per_actor or the cluster's nodes"
    with no_silent_stall(stall_timeout_s, hint=hint), Progress("encode", n, "sentences") as done:
        for batch in embedded.iter_batches(batch_size=None, batch_format="numpy"):
            indices.append(np.asarray(batch[INDEX_COLUMN], dtype=np.int64))
            chunks.append(np.asarray(batch[EMBEDDING_COLUMN], dtype=np.float32))
            done.update(len(indices[-1]))
    index = np.concatenate(indices)  # (n,)
    embeddings = np.concatenate(chunks).reshape(len(index), -1)  # (n, d)
    if len(index) != n or not np.array_equal(np.sort(index), np.arange(n)):
        raise RuntimeError(f"Ray encoding returned {len(index)} rows for {n} sentences")
    out = np.empty_like(embeddings)
    out[index] = embeddings
    return out


def use_encoding_pool(use_ray: bool | str, concurrency: int, address: str | None) -> bool:
    """`use_ray: auto`: a Ray Data actor pool where it pays, this process where it does not.

    A pool pays when there is more than one place to encode: a cluster to join (`address`, or
    RAY_ADDRESS, which `ray job submit` sets: several nodes or GPUs, and a driver that may sit
    on a head offering no compute) or several actors asked for. On one machine with no
    cluster, one process using every core is what `SentenceTransformer.encode` does, and it is
    faster than one actor held to its CPU share (docs/BENCHMARKS.md, "Encoding")."""
    if use_ray != "auto":
        return bool(use_ray)
    return concurrency > 1 or bool(address or os.environ.get("RAY_ADDRESS"))


def make_encoder(
    model_path: str,
    pooler: str | None = None,
    batch_size: int = 128,
    max_seq_length: int | None = None,
    use_ray: bool = True,
    **ray_options: Any,
) -> Callable[[list[str]], np.ndarray]:
    """An ``encode(sentences) -> (n, d)`` function for the metrics (plain ``encode``: no
    query or document role; :func:`make_encoders` for those).

    With ``use_ray`` each call runs :func:`ray_encode` (a fresh actor pool: call it with all
    of a task's sentences at once); without it the model is loaded once, in this process.
    """
    return make_encoders(
        model_path, pooler, batch_size, max_seq_length, use_ray=use_ray, **ray_options
    ).plain


@dataclass(frozen=True)
class RoleEncoders:
    """One model's three encoders: `plain` (``encode``: STS, transfer), `query` and
    `document` (``encode_query`` / ``encode_document`` with the prompts settings)."""

    plain: Callable[[list[str]], np.ndarray]
    query: Callable[[list[str]], np.ndarray]
    document: Callable[[list[str]], np.ndarray]

    @property
    def pair(self) -> tuple[Callable, Callable]:
        """(query encoder, document encoder): what evaluation/beir.py searches with."""
        return self.query, self.document


def make_encoders(
    model_path: str,
    pooler: str | None = None,
    batch_size: int = 128,
    max_seq_length: int | None = None,
    use_ray: bool = True,
    query_prompt: str | None = None,
    document_prompt: str | None = None,
    **ray_options: Any,
) -> RoleEncoders:
    """:class:`RoleEncoders` of the model at `model_path`. With ``use_ray`` each call of any
    of them runs :func:`ray_encode` (a fresh actor pool); without it the model is loaded
    once, in this process, for all three. `query_prompt`, `document_prompt`: the prompts
    settings (None: the model's own)."""
    prompts = {"query_prompt": query_prompt, "document_prompt": document_prompt}
    if use_ray:

        def encoder(embed_as: str | None) -> Callable[[list[str]], np.ndarray]:
            def encode_with_ray(sentences: list[str]) -> np.ndarray:
                return ray_encode(
                    sentences,
                    model_path,
                    pooler=pooler,
                    batch_size=batch_size,
                    max_seq_length=max_seq_length,
                    embed_as=embed_as,
                    **prompts,
                    **ray_options,
                )

            return encode_with_ray

        return RoleEncoders(encoder(None), encoder("query"), encoder("document"))
    if ray_options:
        raise ValueError(f"Ray options {sorted(ray_options)} given with use_ray=False")
    embedder = Embedder(
        model_path, pooler=pooler, batch_size=batch_size, max_seq_length=max_seq_length, **prompts
    )
    return RoleEncoders(
        embedder.embed,
        lambda sentences: embedder.embed(sentences, role="query"),
        lambda sentences: embedder.embed(sentences, role="document"),
    )


class EmbeddingLookup:
    """An encoder over precomputed embeddings: each distinct sentence is embedded once (one
    Ray pass for a whole group of tasks) and the metrics look rows up by text."""

    def __init__(self, sentences: Sequence[str], embeddings: np.ndarray) -> None:
        self.row: dict[str, int] = {s: i for i, s in enumerate(sentences)}
        if len(self.row) != len(sentences):
            raise ValueError("EmbeddingLookup needs distinct sentences")
        self.embeddings = np.asarray(embeddings)  # (n, d)
        if self.embeddings.shape[0] != len(sentences):
            raise ValueError(
                f"{len(sentences)} sentences but {self.embeddings.shape[0]} embedding rows"
            )

    @classmethod
    def encode_all(
        cls, sentences: Sequence[str], encode: Callable[[list[str]], np.ndarray]
    ) -> EmbeddingLookup:
        distinct = list(dict.fromkeys(sentences))
        return cls(distinct, encode(distinct))

    def extend(self, sentences: Sequence[str], encode: Callable[[list[str]], np.ndarray]) -> int:
        """Embed the sentences not yet in the table (one `encode` call); returns how many."""
        new = [s for s in dict.fromkeys(sentences) if s not in self.row]
        if new:
            embeddings = np.asarray(encode(new))  # (len(new), d)
            if embeddings.shape[0] != len(new):
                raise ValueError(f"{len(new)} sentences but {embeddings.shape[0]} embeddings")
            if len(self.row) == 0:
                self.embeddings = embeddings
            else:
                self.embeddings = np.concatenate([self.embeddings, embeddings])
            for s in new:
                self.row[s] = len(self.row)
        return len(new)

    def __call__(self, sentences: list[str]) -> np.ndarray:
        try:
            rows = [self.row[s] for s in sentences]
        except KeyError as err:
            raise KeyError(f"sentence was not encoded beforehand: {err.args[0]!r}") from None
        return self.embeddings[rows]  # (len(sentences), d)
