"""The two baselines the project's training step is measured against, in this process.

- `BareLoop`: the loop a person writes by hand with plain PyTorch and transformers: the same
  math as the project's step (both views in one forward of 2B rows, mean pooling, SimCSE's MLP
  head, InfoNCE at τ + λ·normalised-MSE reconstruction, AdamW, linear decay, gradient
  clipping at 1.0), written without any of the project's code.
- `SentenceTransformersRecipe`: sentence-transformers' unsupervised SimCSE recipe
  (`MultipleNegativesRankingLoss` on (s, s) pairs, scale 1/τ), same model, batch size and max
  length, run by the Hugging Face trainer's inner step with sentence-transformers' own
  collator and loss module.

Both tokenise inside the timed loop, as the project's workers do (there in Ray Data's
prefetch thread), and both report real (non-padding) tokens of both views.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
from torch import nn


@dataclass
class Timing:
    """`steps` timed optimizer steps: wall seconds, sentences and real tokens (both views)."""

    steps: int
    seconds: float
    sentences: int
    real_tokens: int
    padded_tokens: int | None = None  # tokens the hardware processed (padding included)

    @property
    def sentences_per_s(self) -> float:
        return self.sentences / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.real_tokens / self.seconds


class _TimedLoop:
    """`step(texts)` → (real tokens, padded tokens); `run` times a list of batches."""

    def step(self, texts: list[str]) -> tuple[int, int]:
        raise NotImplementedError

    def run(self, batches: list[list[str]], warmup: int) -> Timing:
        """`warmup` untimed steps, then one timed step per remaining batch."""
        for texts in batches[:warmup]:
            self.step(texts)
        real = padded = sentences = 0
        started = time.perf_counter()
        for texts in batches[warmup:]:
            r, p = self.step(texts)
            real, padded, sentences = real + r, padded + p, sentences + len(texts)
        seconds = time.perf_counter() - started
        return Timing(len(batches) - warmup, seconds, sentences, real, padded)


class BareLoop(_TimedLoop):
    """Single-process PyTorch loop, no Ray, no project code; state persists across `run`s."""

    def __init__(
        self,
        model_path: str,
        max_seq_length: int,
        learning_rate: float,
        temperature: float,
        reconstruction_weight: float,
        total_steps: int,
        seed: int = 0,
    ):
        from transformers import AutoModel, AutoTokenizer

        torch.manual_seed(seed)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModel.from_pretrained(model_path, add_pooling_layer=False)
        hidden = self.model.config.hidden_size
        self.mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh())
        self.model.train()
        self.mlp.train()
        self.parameters = list(self.model.parameters()) + list(self.mlp.parameters())
        self.optimizer = torch.optim.AdamW(self.parameters, lr=learning_rate, weight_decay=0.0)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: max(0.0, 1 - step / total_steps)
        )
        self.max_seq_length = max_seq_length
        self.temperature = temperature
        self.reconstruction_weight = reconstruction_weight

    def step(self, texts: list[str]) -> tuple[int, int]:
        """One optimizer step; returns (real tokens, padded tokens) of both views."""
        encoded = self.tokenizer(
            texts,
            padding=True,
            truncation=True,
            max_length=self.max_seq_length,
            return_tensors="pt",
        )
        ids = torch.cat([encoded["input_ids"], encoded["input_ids"]])  # (2B, L)
        mask = torch.cat([encoded["attention_mask"], encoded["attention_mask"]])  # (2B, L)
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state  # (2B, L, h)
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)  # (2B, h)
        z1, z2 = self.mlp(pooled).chunk(2)  # (B, h) each
        n1, n2 = F.normalize(z1, dim=-1), F.normalize(z2, dim=-1)
        logits = n1 @ n2.T / self.temperature  # (B, B)
        labels = torch.arange(len(texts))
        loss = F.cross_entropy(logits, labels)
        loss = loss + self.reconstruction_weight * (F.mse_loss(n1, n2) + F.mse_loss(n2, n1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.parameters, 1.0)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return int(mask.sum()), mask.numel()


class SentenceTransformersRecipe(_TimedLoop):
    """sentence-transformers' SimCSE recipe: MNRL on (s, s) pairs, as its trainer runs it.

    `SentenceTransformerTrainer` needs `accelerate`, which this project does not depend on, so
    this is the trainer's inner step by hand, with sentence-transformers' own pieces: its data
    collator (`model.preprocess` per column), the trainer's feature split, the loss module
    (which merges both columns into one forward of 2B rows, as the project does), and the
    Hugging Face trainer's defaults: fused AdamW (`adamw_torch_fused`, the default on
    torch ≥ 2.8), linear decay, gradient clipping at 1.0. State persists across `run`s.
    """

    def __init__(
        self,
        model_path: str,
        max_seq_length: int,
        learning_rate: float,
        temperature: float,
        total_steps: int,
        seed: int = 0,
    ):
        from sentence_transformers.sentence_transformer.data_collator import (
            SentenceTransformerDataCollator,
        )

        from distributed_emb.model.sentence_transformer import load_sentence_transformer

        torch.manual_seed(seed)
        self.model = load_sentence_transformer(
            model_path, max_seq_length=max_seq_length, device="cpu"
        )
        self.model.train()
        self.collator = SentenceTransformerDataCollator(preprocess_fn=self.model.preprocess)
        self.loss = MultipleNegativesRankingLoss(self.model, scale=1.0 / temperature)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=learning_rate, weight_decay=0.0, fused=True
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: max(0.0, 1 - step / total_steps)
        )

    def step(self, texts: list[str]) -> tuple[int, int]:
        """One optimizer step; returns (real tokens, padded tokens) of both columns."""
        inputs = self.collator([{"anchor": t, "positive": t} for t in texts])
        features = [
            {
                k.removeprefix(column + "_"): v
                for k, v in inputs.items()
                if k.startswith(column + "_")
            }
            for column in ("anchor", "positive")
        ]
        loss = self.loss(features, inputs.get("label"))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        masks = [f["attention_mask"] for f in features]
        return sum(int(m.sum()) for m in masks), sum(m.numel() for m in masks)
