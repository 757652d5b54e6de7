"""The Matryoshka baseline: the encoder itself fine-tuned so that its first k dims work alone.

What users pick today for small vectors: sentence-transformers' ``MatryoshkaLoss`` (Kusupati
et al., NeurIPS 2022, arXiv:2205.13147) around ``MultipleNegativesRankingLoss`` (in-batch
InfoNCE), trained on the same label-free pairs as the MCR² heads (IDC pairs, or each sentence
with itself, SimCSE's dropout views), then truncated to 64, 128, … dims. Unlike the heads it
updates every encoder weight, so it re-embeds every evaluation set: it is opt-in
(``baselines=[..., matryoshka]``) and its budget is ``matryoshka.steps``.

The loop is plain PyTorch over the loss's documented interface
(``loss(features, labels)``, features = one tokenised batch per column), so nothing here needs
the ``datasets`` package or the trainer.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import torch
from pydantic import Field

from distributed_emb.model.sentence_transformer import load_sentence_transformer
from distributed_emb.settings import Seed, section

log = logging.getLogger(__name__)


@section
class MatryoshkaConfig:
    steps: Annotated[int, Field(ge=1, description="optimiser steps (the budget)")] = 200
    batch_size: Annotated[
        int, Field(ge=2, description="pairs per step: in-batch negatives for MNRL")
    ] = 64
    learning_rate: Annotated[float, Field(gt=0, description="AdamW learning rate")] = 2e-5
    positives: Annotated[
        Literal["pairs", "dropout"],
        Field(
            description="pairs: the run's similar pairs (IDC by default); dropout: each training "
            "sentence with itself, two passes differing by dropout (SimCSE's unsupervised recipe)"
        ),
    ] = "pairs"
    seed: Annotated[Seed, Field(description="seed of the fine-tuning")] = 0


@dataclass
class MatryoshkaModel:
    path: str  # the fine-tuned encoder, a SentenceTransformer directory
    dims: list[int]  # the truncation sizes it was trained for (its own size last)
    losses: list[float]
    seconds: float


def train_matryoshka(
    model_path: str,
    pooler: str | None,
    max_seq_length: int | None,
    anchors: list[str],
    positives: list[str],
    dims: list[int],
    config: MatryoshkaConfig,
    output_dir: str | Path,
) -> MatryoshkaModel:
    """Fine-tune the encoder with MatryoshkaLoss(MNRL) over `dims` and its full size; save it
    to `output_dir`. anchors[i] and positives[i] are a similar pair."""
    from sentence_transformers import losses  # startup

    if len(anchors) != len(positives) or len(anchors) < 2:
        raise ValueError(f"need ≥ 2 pairs of equal length, got {len(anchors)}/{len(positives)}")
    start = time.perf_counter()
    torch.manual_seed(config.seed)
    model = load_sentence_transformer(model_path, pooler=pooler, max_seq_length=max_seq_length)
    # Renamed in sentence-transformers 5.x; the old name still works there but warns.
    dimension = getattr(model, "get_embedding_dimension", None)
    full = dimension() if dimension else model.get_sentence_embedding_dimension()
    sizes = sorted({*(d for d in dims if d <= full), full}, reverse=True)
    loss_fn = losses.MatryoshkaLoss(model, losses.MultipleNegativesRankingLoss(model), sizes)
    optimiser = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    preprocess = getattr(model, "preprocess", None) or model.tokenize  # ST < 6: tokenize
    rng = np.random.default_rng(config.seed)
    batch = min(config.batch_size, len(anchors))
    history = []
    model.train()
    for step in range(config.steps):
        take = rng.choice(len(anchors), batch, replace=False)
        features = [
            {
                k: v.to(model.device) if hasattr(v, "to") else v
                for k, v in preprocess([column[i] for i in take]).items()
            }
            for column in (anchors, positives)
        ]  # one tokenised batch per column
        loss = loss_fn(features, None)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        history.append(float(loss.detach()))
        if (step + 1) % 50 == 0 or step + 1 == config.steps:
            log.info("matryoshka step %d/%d: loss %.4f", step + 1, config.steps, history[-1])
    model.eval()
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    model.save(str(output_dir))
    return MatryoshkaModel(str(output_dir), sizes[::-1], history, time.perf_counter() - start)


def truncate(vectors: np.ndarray, dim: int) -> np.ndarray:
    """A Matryoshka vector cut to its first `dim` coordinates: (n, D) → (n, dim)."""
    return np.ascontiguousarray(vectors[:, :dim])
