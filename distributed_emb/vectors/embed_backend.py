"""`embed.backend`: a corpus embedded by the torch model (`torch`) or by its exported ONNX graph
through onnxruntime (`onnx`: fp32, `onnx_int8`: int8 weights), with no torch model in the actors.

The graph, found or made by the driver before any actor starts (:func:`prepare_graph`):

1. the model's own ``onnx/`` folder, where `jobs/export_onnx.py` or the training job's
   `export.backends` wrote it (model/onnx_export.py), when the job embeds the model as saved
   (a sentence-transformers directory, no `model.pooler` over a plain encoder) and the folder
   holds the variant;
2. else ``<embed.graph_cache>/<key>/`` (default ``OUT/graphs/``), one folder per model (`key`:
   a digest of its files and pooler): exported there on first use, by the export job's code
   (model/onnx_export.py ``export_onnx``: both variants) from the model as the job loads it
   (pooling, length), then checked by its serving check, and reused by every later run.

Either way the variant's figures come from the export's serving check
(model/serving_check.py: mean and worst cosine with the torch model over the STS-B dev
sentences, and each backend's STS-B dev Spearman), which export.json records; a variant whose
mean cosine is below the export job's minimum (onnx.min_mean_cosine_<variant>) is refused,
naming the figure. The manifest records the backend, the graph and those figures
(`agreement`); search embeds its queries through the same graph.

:class:`GraphEmbedder` is the actors' embedder for a graph: the keywords and methods of
model/embedder.py :class:`~distributed_emb.model.embedder.Embedder` that the encoding pool and
the shard writer use, over an :class:`~distributed_emb.model.onnx_embedder.OnnxEmbedder` (its
prompts, its sorting of each call's texts by length), with the actor's threads as
onnxruntime's intra-op threads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from distributed_emb.atomic_files import staged_directory
from distributed_emb.errors import UserInputError
from distributed_emb.model.model_config import ROLES, ST_CONFIG_FILE
from distributed_emb.model.onnx_config import (
    BACKEND_VARIANTS,
    VARIANTS,
    minimum_mean_cosine,
)
from distributed_emb.storage import copy_to_storage, is_remote, join, local_model_dir, read_text

log = logging.getLogger(__name__)

GRAPHS = "graphs"  # OUT/graphs/<key>/: graphs exported by the embed job (embed.graph_cache)
CHECKED_ON = "STS-B dev"  # what the serving check embeds (model/serving_check.py)
EMBEDDING_COLUMN = "embedding"  # model/embedder.py's (not imported: that module loads torch)


class BackendCheckError(UserInputError):
    """The graph does not embed as the torch model does (the export's check failed)."""


@dataclass(frozen=True)
class Graph:
    """An exported graph the job embeds with: `location` holds ``onnx/`` (a model directory,
    or a folder of embed.graph_cache); `agreement`: the check's figures for `variant`."""

    location: str
    variant: str
    agreement: dict
    source: str  # "model" (its own onnx/ folder), "cache" (exported earlier), "exported"


def graph_key(model_files: str | None, model: str, pooler: str | None) -> str:
    """The cache folder's name: a digest of the model's files (its location where they cannot
    be read, a hub name) and the pooler the job puts on a plain encoder."""
    source = json.dumps([model_files or model, pooler])
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def prepare_graph(
    backend: str,
    model: str,
    model_files: str | None,
    pooler: str | None,
    graph_cache: str,
    max_seq_length: int | None = None,
    trust_remote_code: bool = False,
) -> Graph:
    """The graph of `backend` for the model at `model` (embedding_settings.model_location)
    loaded with `pooler` (None: as saved): the model's own onnx/ folder, else the folder of
    `graph_cache` for it, exported and checked there on first use. Raises BackendCheckError
    when the variant failed the check."""
    from distributed_emb.model.onnx_files import ONNX_DIR

    variant = BACKEND_VARIANTS[backend]
    own = _export_info(model) if pooler is None else None
    if own is not None and variant in own["variants"]:
        checked = own.get("backends") or {}
        if f"onnx_{variant}" not in checked:  # exported without its check: checked here
            checked = _serving_check(local_model_dir(model), [variant])
        graph = Graph(model, variant, agreement_of(checked, variant), "model")
        log.info("embed.backend=%s: the graph in %s", backend, join(model, ONNX_DIR))
    else:
        cache = join(graph_cache, graph_key(model_files, model, pooler))
        info = _export_info(cache)
        source = "cache"
        if info is None or variant not in info["variants"] or "backends" not in info:
            log.info(
                "embed.backend=%s: exporting %s to ONNX into %s (once per model), then "
                "checking it against the torch model on %s",
                backend, model, cache, CHECKED_ON,
            )  # fmt: skip
            info = export_graphs(model, pooler, cache, max_seq_length, trust_remote_code)
            source = "exported"
        else:
            log.info("embed.backend=%s: the graph exported earlier into %s", backend, cache)
        graph = Graph(cache, variant, agreement_of(info["backends"], variant), source)
    require_agreement(backend, graph.agreement)
    return graph


def _export_info(location: str) -> dict | None:
    """The onnx/export.json under `location` when this project's exporter wrote it, else
    None (none there, a hub name, or another tool's folder)."""
    from distributed_emb.model.onnx_files import EXPORT_INFO_FILE, EXPORTER, ONNX_DIR

    try:
        text = read_text(join(location, ONNX_DIR, EXPORT_INFO_FILE))
    except OSError:  # a hub name or an unreachable path: no folder to read
        return None
    info = json.loads(text) if text else None
    return info if isinstance(info, dict) and info.get("exporter") == EXPORTER else None


def export_graphs(
    model: str,
    pooler: str | None,
    cache: str,
    max_seq_length: int | None = None,
    trust_remote_code: bool = False,
) -> dict:
    """The model at `model`, loaded as the job loads it (`pooler`, `max_seq_length`), exported
    by model/onnx_export.py (fp32 and int8) and checked by model/serving_check.py, into the
    folder `cache` (local or object storage): its onnx/ folder and the model's prompts
    (config_sentence_transformers.json), not its weights. Returns export.json's content."""
    from distributed_emb.model.onnx_export import export_onnx  # startup: torch
    from distributed_emb.model.onnx_files import ONNX_DIR, write_export_info
    from distributed_emb.model.sentence_transformer import load_sentence_transformer

    with tempfile.TemporaryDirectory(prefix="embed_graph_") as scratch:
        model_dir = Path(scratch) / "model"
        loaded = load_sentence_transformer(
            model,
            pooler=pooler,
            max_seq_length=max_seq_length,
            device="cpu",
            trust_remote_code=trust_remote_code,
        )
        loaded.save(str(model_dir))
        del loaded
        info = export_onnx(model_dir, VARIANTS)
        info["backends"] = _serving_check(model_dir, list(VARIANTS))
        info["check_passed"] = all(
            info["backends"][f"onnx_{v}"]["cosine_to_torch_mean"] >= minimum_mean_cosine(v)
            for v in VARIANTS
        )
        write_export_info(model_dir, info)
        graph = Path(scratch) / "graph"
        shutil.copytree(model_dir / ONNX_DIR, graph / ONNX_DIR)
        if (model_dir / ST_CONFIG_FILE).is_file():  # the prompts OnnxEmbedder reads
            shutil.copy2(model_dir / ST_CONFIG_FILE, graph / ST_CONFIG_FILE)
        if is_remote(cache):
            copy_to_storage(graph, cache)
        else:
            with staged_directory(cache) as staged:
                shutil.copytree(graph, staged, dirs_exist_ok=True)
    return info


def _serving_check(model_dir: str | Path, variants: list[str]) -> dict:
    from distributed_emb.model.serving_check import serving_check  # startup: torch

    return serving_check(model_dir, variants)


def agreement_of(backends: dict, variant: str) -> dict:
    """What the manifest records of the check (export.json's "backends") for `variant`."""
    checked = backends[f"onnx_{variant}"]
    return {
        "variant": variant,
        "checked_on": CHECKED_ON,
        "sentences": checked["sentences"],
        "cosine_to_torch_mean": round(float(checked["cosine_to_torch_mean"]), 6),
        "cosine_to_torch_min": round(float(checked["cosine_to_torch_min"]), 6),
        "stsb_dev_spearman": round(float(checked["stsb_dev_spearman"]), 2),
        "torch_stsb_dev_spearman": _rounded(backends.get("torch", {}).get("stsb_dev_spearman")),
        "min_mean_cosine": minimum_mean_cosine(variant),
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(float(value), 2)


def require_agreement(backend: str, agreement: dict) -> None:
    """Refuse a graph whose mean cosine with the torch model is below the export's minimum."""
    mean, least = agreement["cosine_to_torch_mean"], agreement["min_mean_cosine"]
    if mean < least:
        raise BackendCheckError(
            f"embed.backend={backend}: the {agreement['variant']} graph's mean cosine with the "
            f"torch model is {mean:.4f} over {agreement['sentences']} {agreement['checked_on']} "
            f"sentences (worst {agreement['cosine_to_torch_min']:.4f}), below the export "
            f"check's {least}; embed with embed.backend=torch"
        )


class GraphEmbedder:
    """An exported graph for inference, with :class:`~distributed_emb.model.embedder.Embedder`'s
    keywords (what encoding_pool passes every actor) and the methods the pool and the shard
    writer call. `model_path` is the folder holding onnx/ (local or object storage: copied to
    the node once); `variant` the graph; `torch_threads` onnxruntime's intra-op threads;
    `pooler`, `device`, `trust_remote_code` and `compute_dtype` have no use here (the graph holds
    the model's pooling and its own number format; it runs on CPUs)."""

    # What the shard writer records of a torch model's number format: nothing for a graph.
    compute_dtype = None
    precision_check = None

    def __init__(
        self,
        model_path: str,
        variant: str = "int8",
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
        from distributed_emb.model.onnx_embedder import OnnxEmbedder  # startup: onnxruntime

        if embed_as is not None and embed_as not in ROLES:
            raise ValueError(f"embed_as must be one of {ROLES} or None, got {embed_as!r}")
        self.graph = OnnxEmbedder(
            local_model_dir(model_path),
            variant,
            batch_size=batch_size,
            threads=torch_threads,
            query_prompt=query_prompt,
            document_prompt=document_prompt,
            max_seq_length=max_seq_length,
        )
        self.text_column = text_column
        self.output_column = output_column
        self.normalize = normalize
        self.embed_as = embed_as

    def prompt(self, role: str | None) -> str:
        return self.graph.prompt(role)

    @property
    def normalizes(self) -> bool:
        return self.normalize or "Normalize" in self.graph.modules

    @property
    def dimension(self) -> int:
        return self.graph.dimension

    def embed(self, sentences: Sequence[str], role: str | None = None) -> np.ndarray:
        """(n, d) float32, in order, embedded as `role` (None: the embedder's `embed_as`), as
        Embedder.embed embeds them; L2-normalised with `normalize`."""
        vectors = self.graph.embed(sentences, role or self.embed_as)
        if self.normalize:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors = vectors / np.maximum(norms, 1e-12)  # torch.nn.functional.normalize's
        return vectors.astype(np.float32, copy=False)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.text_column not in batch:
            raise KeyError(
                f"batch has no text column {self.text_column!r}; columns: {sorted(batch)}"
            )
        out = dict(batch)
        out[self.output_column] = self.embed([str(s) for s in batch[self.text_column]])
        return out


def graph_reference(out: str, graph: Graph) -> str:
    """The graph's location as the manifest records it: relative to OUT when inside it (an
    output copied elsewhere still finds its graph), else as given."""
    prefix = str(out).rstrip("/") + "/"
    return graph.location[len(prefix) :] if graph.location.startswith(prefix) else graph.location


def graph_location(out: str, recorded: str) -> str:
    """The location of a manifest's recorded graph: relative ones are inside OUT."""
    if is_remote(recorded) or Path(recorded).is_absolute():
        return recorded
    return join(out, recorded)
