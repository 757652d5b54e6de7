"""The loss terms, one row each: what a term is called, the `loss` setting that weighs it, its
symbol, what it does, where it comes from, and how it is computed.

    L = α·L_C + λ·L_R + β·L_MLM + δ·L_D + γ·L_MCR²        (Σ over TERMS of weight · term)

Everything that names the terms reads this table: the step's objective (train/step.py
`embedding_objective`, `add_mlm_term`), the config's check that some term has a weight
(`require_a_weighted_term`, called by config.py), and the model card's method and objective
lines (train/run_card.py). tests/losses/test_terms.py fails when a `*_weight` field of
`LossConfig` has no row. Adding a term touches its module (the math, in losses/) and its row
here (with the few lines that call the module).

No torch at import: the config loader reads this table. Each row's `compute` imports its
module when it is first called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from distributed_emb.checks import require
from distributed_emb.losses.loss_config import LossConfig

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Views:
    """What the embedding terms read of one batch on this worker (train/step.py)."""

    z1: torch.Tensor  # (B, d) the first views
    z2: torch.Tensor  # (B, d) the second views (for pairs: the positives)
    groups: torch.Tensor | None = None  # (B,) the rows' documents or clusters
    teacher_vectors: torch.Tensor | None = None  # (2B, D) the teacher's, rows behind z1 then z2
    sizes: list[int] | None = None  # every rank's B, where the step gathered them already
    negatives: torch.Tensor | None = None  # (B, d) the rows' hard negatives (L_C alone)


@dataclass(frozen=True)
class LossTerm:
    """One term of the objective.

    `compute`, by `reads`:
      "views": compute(views: Views, loss: LossConfig) → (value, metrics): the term on the
        two views, summed by train/step.py `embedding_objective`; metrics stay tensors.
      "mlm": compute(logits (B, L, V), labels (B, L)) → value: the MLM head's output, made by
        the same forward as the views and added by train/step.py `add_mlm_term` (per
        mini-batch in train/grad_cache.py).
    `settings(loss)`: the term's own settings as the card states them; `note(loss)`, where
    given, a clause the card's objective line ends with.
    """

    name: str  # what the card calls it
    weight_key: str  # its weight: a field of LossConfig (`loss.<weight_key>`)
    symbol: str  # the weight's symbol in L = α·L_C + …
    description: str  # one line: what the term does
    citation: str  # where it comes from
    compute: Callable
    settings: Callable[[LossConfig], str]
    reads: Literal["views", "mlm"] = "views"
    note: Callable[[LossConfig], str] | None = None

    def weight(self, loss: LossConfig) -> float:
        return getattr(loss, self.weight_key)

    @property
    def key(self) -> str:
        """The dotted setting: loss.contrastive_weight."""
        return f"loss.{self.weight_key}"


def _contrastive(views: Views, loss: LossConfig):
    from distributed_emb.losses.info_nce import info_nce_loss

    value = info_nce_loss(
        views.z1,
        views.z2,
        loss.temperature,
        loss.gather_negatives,
        views.groups,
        views.sizes,
        views.negatives,
    )
    return value, {"loss_contrastive": value.detach()}


def _reconstruction(views: Views, loss: LossConfig):
    from distributed_emb.losses.reconstruction import reconstruction_loss

    value = reconstruction_loss(views.z1, views.z2, loss.reconstruction_form)
    return value, {"loss_reconstruction": value.detach()}


def _mlm(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    from distributed_emb.losses.mlm import mlm_loss

    return mlm_loss(logits, labels)


def _distillation(views: Views, loss: LossConfig):
    from distributed_emb.losses.distillation import distillation_loss

    if views.teacher_vectors is None:
        raise ValueError("loss.distill_weight > 0 but the batch has no teacher vectors")
    value = distillation_loss(views.z1, views.z2, views.teacher_vectors)
    return value, {"loss_distill": value.detach()}


def _mcr2(views: Views, loss: LossConfig):
    from distributed_emb.losses.mcr2 import mcr2_term

    value, metrics = mcr2_term(views.z1, views.z2, loss.mcr2, views.groups, views.teacher_vectors)
    return value, {f"mcr2_{k}": views.z1.new_tensor(v) for k, v in metrics.items()}


def _negatives(loss: LossConfig) -> str:
    where = "the global batch" if loss.gather_negatives else "each worker's batch"
    return f"in-batch negatives from {where}"


def _teacher(loss: LossConfig) -> str:
    if loss.distill_teacher is None:
        return "teacher: the starting model, a pull toward what it knows"
    return "teacher: loss.distill_teacher"


def _mcr2_settings(loss: LossConfig) -> str:
    m = loss.mcr2
    parts = [f"ε = {m.eps:g}", f"w_e = {m.expand_weight:g}", f"w_c = {m.compress_weight:g}"]
    parts.append(f"λ_p = {m.pair_weight:g}")
    parts.append(f"μ = {m.distill_weight:g}")
    if m.distill_weight > 0:
        parts.append(f"τ_μ = {m.distill_temperature:g}")
    return ", ".join(parts)


# In the order the objective adds them (train/step.py: the same sum, bit for bit, as before the
# table); the MLM term, read from the MLM head, is added after the embedding terms.
TERMS: tuple[LossTerm, ...] = (
    LossTerm(
        name="InfoNCE",
        weight_key="contrastive_weight",
        symbol="α",
        description="contrastive: each first view picks out its own second view among the batch's",
        citation="Gao et al., SimCSE (2021), eq. 1, with hard negatives eq. 5",
        compute=_contrastive,
        settings=lambda loss: f"τ = {loss.temperature:g}",
        note=_negatives,
    ),
    LossTerm(
        name="reconstruction ‖z¹ − z²‖²",
        weight_key="reconstruction_weight",
        symbol="λ",
        description="pulls each row's two views together",
        citation="Chen et al., InforMin-CL (2022), eq. 8",
        compute=_reconstruction,
        settings=lambda loss: loss.reconstruction_form,
    ),
    LossTerm(
        name="MLM",
        weight_key="mlm_weight",
        symbol="β",
        description="masked-language modelling on a masked copy of the first view",
        citation="Devlin et al., BERT (2019); SimCSE's auxiliary objective (Gao et al., 2021)",
        compute=_mlm,
        settings=lambda loss: f"p = {loss.mlm_probability:g}",
        reads="mlm",
    ),
    LossTerm(
        name="distillation MSE",
        weight_key="distill_weight",
        symbol="δ",
        description="the mean squared error to a frozen teacher's vectors of the same texts",
        citation="Reimers & Gurevych (2020), sentence-transformers' MSELoss",
        compute=_distillation,
        settings=_teacher,
    ),
    LossTerm(
        name="MCR²",
        weight_key="mcr2_weight",
        symbol="γ",
        description=(
            "maximal coding rate reduction of each worker's first views: spread the batch, "
            "pack each group, keep the two views and the teacher's in-batch neighbours close"
        ),
        citation="Yu et al. (2020); Ševerdija et al. (2023)",
        compute=_mcr2,
        settings=_mcr2_settings,
    ),
)

BY_KEY: dict[str, LossTerm] = {term.weight_key: term for term in TERMS}
MLM = BY_KEY["mlm_weight"]
# The terms on the two views, in the order embedding_objective adds them.
VIEW_TERMS: tuple[LossTerm, ...] = tuple(term for term in TERMS if term.reads == "views")


def weighted_terms(loss: LossConfig) -> list[LossTerm]:
    """The terms with a weight > 0, in the table's order: the ones a run computes."""
    return [term for term in TERMS if term.weight(loss) > 0]


def require_a_weighted_term(loss: LossConfig) -> None:
    """ConfigError (key `loss`) where every term has weight 0."""
    require(
        bool(weighted_terms(loss)),
        "loss",
        f"every term has weight 0 ({', '.join(term.key for term in TERMS)}): nothing to train",
    )
