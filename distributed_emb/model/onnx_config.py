"""The ONNX export's settings (`onnx.*` of `jobs/export_onnx.py`), declared apart from the
exporter so that loading a config imports neither torch nor onnxruntime."""

from __future__ import annotations

from dataclasses import field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from distributed_emb.checks import ConfigError
from distributed_emb.settings import section

Variant = Literal["fp32", "int8"]
VARIANTS: tuple[str, ...] = ("fp32", "int8")

# What embeds a job's texts (`embed.backend`, search's `backend`): the torch model, or one of its
# exported graphs through onnxruntime; each graph backend's variant. The serving check names its
# results "onnx_<variant>" (model/serving_check.py).
Backend = Literal["torch", "onnx", "onnx_int8"]
BACKENDS: tuple[str, ...] = ("torch", "onnx", "onnx_int8")
BACKEND_VARIANTS = {"onnx": "fp32", "onnx_int8": "int8"}

# 17 is the first opset with LayerNormalization, which keeps a BERT layer norm one node; every
# onnxruntime release of the last years runs it.
DEFAULT_OPSET = 17


@section
class OnnxExportConfig:
    variants: Annotated[
        list[Variant],
        Field(
            min_length=1,
            description="the graphs to write: fp32 (onnx/model.onnx) and int8 (onnx/"
            "model_qint8.onnx, weights quantised to int8, activations at run time)",
        ),
    ] = field(default_factory=lambda: list(VARIANTS))
    opset: Annotated[
        int, Field(ge=14, le=21, description="the ONNX opset the graph is written in")
    ] = DEFAULT_OPSET
    # Per-channel scales and full range are what sentence-transformers' int8 export uses
    # (optimum's avx512_vnni / arm64 configurations). Per-tensor scales lost MiniLM 0.03 of
    # cosine to the fp32 model on STS-B dev (mean 0.964, worst row 0.87), per-channel 0.007.
    int8_per_channel: Annotated[
        bool,
        Field(description="one int8 scale per output channel of each weight (false: per tensor)"),
    ] = True
    int8_reduce_range: Annotated[
        bool,
        Field(
            description="7-bit weights, for CPUs without VNNI where 8-bit products can saturate "
            "(costs accuracy where VNNI is present)"
        ),
    ] = False
    stsb_pairs: Annotated[
        int | None,
        Field(
            ge=2,
            description="STS-B dev pairs the check embeds with torch and each graph (their "
            "sentences for the cosine agreement, the pairs for Spearman); null: all 1500",
        ),
    ] = None
    batch_size: Annotated[int, Field(ge=1, description="sentences per run of the check")] = 64
    min_mean_cosine_fp32: Annotated[
        float,
        Field(
            gt=0,
            le=1,
            description="the fp32 graph fails the check below this mean cosine with torch",
        ),
    ] = 0.999
    min_mean_cosine_int8: Annotated[
        float,
        Field(
            gt=0,
            le=1,
            description="the int8 graph fails the check below this mean cosine with torch",
        ),
    ] = 0.97


def minimum_mean_cosine(variant: str) -> float:
    """The least mean cosine with the torch model a `variant` graph must reach on the serving
    check (the export job's default onnx.min_mean_cosine_<variant>)."""
    return getattr(OnnxExportConfig(), f"min_mean_cosine_{variant}")


@section
class OnnxModelConfig:
    path: Annotated[
        str | None,
        Field(
            description="the sentence-transformers directory to export; the graphs go into its "
            "onnx/ folder"
        ),
    ] = None


@section
class OnnxCheckData:
    senteval_dir: Annotated[
        str | None,
        Field(
            description="SentEval's data/downstream directory holding STS-B; null: the shipped copy"
        ),
    ] = None


@section
class OnnxJobConfig:
    model: OnnxModelConfig = field(default_factory=OnnxModelConfig)
    eval: OnnxCheckData = field(default_factory=OnnxCheckData)
    onnx: OnnxExportConfig = field(default_factory=OnnxExportConfig)

    def validate(self) -> None:
        """What the declarations cannot say: a model directory is given and exists, each
        variant is named once."""
        if self.model.path is None:
            raise ConfigError(
                "model.path: give the sentence-transformers directory to export (the ONNX "
                "files are written into its onnx/ folder)"
            )
        if not Path(self.model.path).is_dir():
            raise ConfigError(
                f"model.path: {self.model.path} is not a local model directory (the export "
                "writes into it)"
            )
        if len(set(self.onnx.variants)) != len(self.onnx.variants):
            raise ConfigError(f"onnx.variants: {self.onnx.variants} names a variant twice")
        directory = self.eval.senteval_dir
        if directory is not None and not Path(directory).is_dir():
            raise ConfigError(f"eval.senteval_dir: {directory} is not a directory")
