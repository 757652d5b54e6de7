"""Does an exported ONNX graph embed as the torch model does? Cosine agreement and STS-B dev.

The sentences of STS-B dev pairs are embedded once by the SentenceTransformer (the project's
:class:`~distributed_emb.model.embedder.Embedder`) and once by each exported variant
(:class:`~distributed_emb.model.onnx_embedder.OnnxEmbedder`); per variant, the mean and the
worst row cosine with torch's vector, and each backend's STS-B dev Spearman × 100. STS-B and
its scores come from below model/ (data/senteval_files.py, scoring.py: the reader and scores
every STS number of evaluation/ uses), never from evaluation/, which sits above. The result is
a dict keyed by backend (``torch``, ``onnx_fp32``, ``onnx_int8``), the "backends" entry of
export.json and of a run's metrics.json.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from distributed_emb.data.senteval_files import StsData, read_stsb
from distributed_emb.model.embedder import Embedder, EmbeddingLookup
from distributed_emb.model.onnx_embedder import OnnxEmbedder
from distributed_emb.model.onnx_files import ONNX_DIR, read_export_info
from distributed_emb.scoring import pair_cosines, spearman_of_embeddings


def serving_check(
    model_dir: str | os.PathLike,
    variants: Sequence[str] | None = None,
    senteval_dir: str | None = None,
    max_pairs: int | None = None,
    batch_size: int = 64,
    threads: int | None = None,
) -> dict:
    """Each exported variant (all in export.json when None) against the torch model on the first
    `max_pairs` STS-B dev pairs (all when None) of `senteval_dir` (the shipped copy when None).

    Returns ``{"torch": {"stsb_dev_spearman", "pairs"}, "onnx_<variant>": {"file",
    "stsb_dev_spearman", "pairs", "cosine_to_torch_mean", "cosine_to_torch_min",
    "sentences"}, ...}``. `threads`: onnxruntime's intra-op threads (torch's are the
    process's)."""
    info = read_export_info(model_dir)
    variants = list(info["variants"]) if variants is None else list(variants)
    data = read_stsb("dev", senteval_dir, max_pairs)
    sentences = list(dict.fromkeys(data.sentences1 + data.sentences2))
    reference = Embedder(str(model_dir), batch_size=batch_size).embed(sentences)  # (n, d)
    backends = {
        "torch": {
            "stsb_dev_spearman": _spearman(EmbeddingLookup(sentences, reference), data),
            "pairs": len(data),
        }
    }
    for variant in variants:
        embedder = OnnxEmbedder(model_dir, variant, batch_size=batch_size, threads=threads)
        embeddings = embedder.embed(sentences)  # (n, d)
        agreement = pair_cosines(embeddings, reference)  # (n,)
        backends[f"onnx_{variant}"] = {
            "file": f"{ONNX_DIR}/{embedder.path.name}",
            "stsb_dev_spearman": _spearman(EmbeddingLookup(sentences, embeddings), data),
            "pairs": len(data),
            "cosine_to_torch_mean": float(agreement.mean()),
            "cosine_to_torch_min": float(agreement.min()),
            "sentences": len(sentences),
        }
    return backends


def _spearman(lookup: EmbeddingLookup, data: StsData) -> float:
    """STS-B dev Spearman × 100 of one backend's vectors, looked up by sentence."""
    return spearman_of_embeddings(lookup(data.sentences1), lookup(data.sentences2), data.scores)


def below_minimum(backends: Mapping[str, dict], minimums: Mapping[str, float]) -> list[str]:
    """One line per ONNX backend whose mean cosine with torch is below its variant's minimum
    (`minimums`: variant → least mean cosine)."""
    lines = []
    for name, result in backends.items():
        variant = name.removeprefix("onnx_")
        if name.startswith("onnx_") and variant in minimums:
            mean = result["cosine_to_torch_mean"]
            if mean < minimums[variant]:
                lines.append(
                    f"{name}: mean cosine with the torch model {mean:.4f} < {minimums[variant]}"
                )
    return lines


def format_backends(backends: Mapping[str, dict]) -> str:
    """The check as a small table: one row per backend."""
    rows = [
        "backend      STS-B dev   mean cos   min cos   (cosine with torch over "
        f"{next((r['sentences'] for r in backends.values() if 'sentences' in r), 0)} sentences)"
    ]
    for name, result in backends.items():
        mean = result.get("cosine_to_torch_mean")
        worst = result.get("cosine_to_torch_min")
        rows.append(
            f"{name:<12} {result['stsb_dev_spearman']:9.2f}   "
            + (f"{mean:8.4f}   {worst:7.4f}" if mean is not None else f"{'—':>8}   {'—':>7}")
        )
    return "\n".join(rows)
