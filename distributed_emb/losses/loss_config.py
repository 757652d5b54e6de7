"""The loss settings (the training config's `loss` section and the MCR² job's), declared
apart from the losses so that loading a config does not import torch."""

from __future__ import annotations

from dataclasses import field
from typing import Annotated, Literal

from pydantic import Field

from distributed_emb.settings import section

# μ of the neighbourhood term where a head compresses an encoder (the compression job's
# default, and fine-tuning's): without it the MCR² head lost to PCA on every STS set it never
# saw; 10 had the best STS-B + SICK-R dev average at 64 dims, level with the best at 128
# (docs/MCR2.md, "Choosing the current default").
COMPRESSION_DISTILL_WEIGHT = 10.0


@section
class MCR2LossConfig:
    # The MCR² paper's ε² = 0.5 is eps ≈ 0.707.
    eps: Annotated[float, Field(gt=0, description="ε of R(Z) = ½·logdet(I + d/(n·ε²)·ZᵀZ)")] = 0.5
    pair_weight: Annotated[
        float,
        Field(ge=0, description="λ of the pair term −λ·mean cos(ẑ¹ᵢ, ẑ²ᵢ); 0 turns it off"),
    ] = 1.0
    compress_weight: Annotated[
        float,
        Field(
            ge=0,
            description="weight of R_c: 1.0 is the MCR² objective ΔR = R − R_c; 0 keeps only "
            "the expansion term",
        ),
    ] = 1.0
    # 0 with compress_weight=0 and pair_weight=0 leaves the distillation term alone: the
    # "distillation only" arm the MCR² terms are measured against (docs/MCR2.md).
    expand_weight: Annotated[
        float,
        Field(
            ge=0,
            description="weight of the expansion term −R(Z): 1.0 is the MCR² objective; 0 "
            "turns it off",
        ),
    ] = 1.0
    compute_dtype: Annotated[
        Literal["float32", "float64"] | None,
        Field(
            description="float64 computes the Grams and logdets in double precision (slower, "
            "exact metrics); null: the vectors' own"
        ),
    ] = None
    # The compression job sets it (mcr2/compression_config.py).
    distill_weight: Annotated[
        float,
        Field(
            ge=0,
            description="μ of the similarity distillation term μ·KL(P_teacher ‖ P_z) over each "
            "row's in-batch neighbours (losses/distillation.py); 0 turns it off",
        ),
    ] = 0.0
    distill_temperature: Annotated[
        float,
        Field(
            gt=0, description="τ of both softmaxes over in-batch cosine similarities in μ's term"
        ),
    ] = 0.05


@section
class LossConfig:
    temperature: Annotated[float, Field(gt=0, description="τ of InfoNCE")] = 0.05
    reconstruction_weight: Annotated[
        float,
        Field(ge=0, description="λ, the weight of InforMin-CL's reconstruction term ‖z¹ − z²‖²"),
    ] = 0.1
    # normalized_mse is the authors' released code; squared_norm the paper's eq. 8.
    reconstruction_form: Annotated[
        Literal["normalized_mse", "squared_norm"],
        Field(
            description="normalized_mse: L2-normalised z, element-mean squared error; "
            "squared_norm: raw z, mean over rows of the squared L2 distance"
        ),
    ] = "normalized_mse"
    mlm_weight: Annotated[
        float, Field(ge=0, description="β, the weight of the masked-language-model term")
    ] = 0.0
    mlm_probability: Annotated[
        float, Field(gt=0, lt=1, description="share of tokens masked for the MLM term")
    ] = 0.15
    gather_negatives: Annotated[
        bool, Field(description="negatives from every worker's batch (the global batch)")
    ] = True
    contrastive_weight: Annotated[
        float, Field(ge=0, description="α, the weight of InfoNCE; 0 turns it off (distillation)")
    ] = 1.0
    # The plain way to shrink a model; the distilled vector is the exported one (no MLP).
    distill_weight: Annotated[
        float,
        Field(
            ge=0,
            description="δ, the weight of the mean squared error to a frozen teacher's vectors "
            "(losses/distillation.py); with no loss.distill_teacher the teacher is the starting "
            "model: a pull toward what the given model knows",
        ),
    ] = 0.0
    distill_teacher: Annotated[
        str | None,
        Field(
            description="the teacher of δ and of loss.mcr2's neighbourhood term: a model path "
            "or hub name sharing the student's tokenizer and width; null: model.path, the "
            "starting model itself"
        ),
    ] = None
    # −R(Z) + R_c(Z, Π) with Π the batch's data.group_column, − λ·cos of the two dropout views,
    # + μ·KL to the teacher's in-batch neighbours.
    mcr2_weight: Annotated[
        float,
        Field(
            ge=0,
            description="γ, the weight of the MCR² objective (losses/mcr2.py) on each worker's "
            "batch; 0 turns it off",
        ),
    ] = 0.0
    mcr2: MCR2LossConfig = field(
        default_factory=lambda: MCR2LossConfig(distill_weight=COMPRESSION_DISTILL_WEIGHT)
    )

    @property
    def needs_teacher(self) -> bool:
        """Does a term read the teacher's vectors (`teacher_vectors` of a batch)?"""
        return self.distill_weight > 0 or (self.mcr2_weight > 0 and self.mcr2.distill_weight > 0)
