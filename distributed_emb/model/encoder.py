"""The trainable sentence encoder: HF AutoModel + pooler [+ SimCSE's training-only MLP head]
[+ an MCR² compression head, fine-tuned end to end with the encoder].

Both dropout views go through ONE forward pass of 2B rows (as SimCSE does): half the kernel
launches, and each view still gets its own dropout masks.
"""

from __future__ import annotations

import logging
import warnings

import torch
from torch import nn
from transformers import AutoModel, AutoModelForMaskedLM

from distributed_emb.model.sentence_transformer import POOLERS, hf_pooler_dense

log = logging.getLogger(__name__)


class TrainableEncoder(nn.Module):
    """The module Ray Train trains; inference goes through model/embedder.py."""

    def __init__(
        self,
        model_path: str,
        pooler: str = "mean",
        mlp_head: bool = True,
        with_mlm_head: bool = False,
        trust_remote_code: bool = False,
        compression_head: nn.Module | None = None,
    ):
        super().__init__()
        if pooler not in POOLERS:
            raise ValueError(f"unknown pooler {pooler!r}; expected one of {POOLERS}")
        self.model_path = model_path
        self.pooler = pooler
        self.backbone = AutoModel.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        if pooler == "cls":
            hf_pooler_dense(self.backbone)  # fail now, with a clear message, if it is missing
        elif getattr(self.backbone, "pooler", None) is not None:
            # Unused parameters would make DDP wait forever for their gradients.
            self.backbone.pooler = None
        hidden = self.backbone.config.hidden_size
        self.hidden_size = hidden
        # SimCSE's MLP: fresh dense + tanh over the pooled vector.
        self.mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh()) if mlp_head else None
        self.mlm_model = self._attach_mlm_head(trust_remote_code) if with_mlm_head else None
        # An MCR² head (model/compression_head.py) trained on the frozen encoder's pooled
        # vectors (the same pooler: the training job checks it), trained on from there.
        self.compression_head = compression_head
        self.pad_to_multiple_of: int | None = None  # set by compile_backbone

    def compile_backbone(self, pad_to_multiple_of: int = 8) -> None:
        """torch.compile the transformer in place (the MLM head's body is the same module).
        Inputs are padded to a multiple of `pad_to_multiple_of` tokens first: a batch's
        length varies with its longest sentence, and each new length is a new graph (or a
        dynamic one) to compile; 8 also suits GPU tensor cores. Padding is masked, and the
        token states are cut back to the batch's length, so nothing downstream changes."""
        self.pad_to_multiple_of = pad_to_multiple_of
        self.backbone.compile()

    def _run_backbone(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        """(N, L) ids and mask → (N, L, h) token states, padded for the compiled graph."""
        length = input_ids.shape[1]
        pad = -length % self.pad_to_multiple_of if self.pad_to_multiple_of else 0
        if pad:
            input_ids = nn.functional.pad(input_ids, (0, pad), value=self._pad_token_id)
            attention_mask = nn.functional.pad(attention_mask, (0, pad), value=0)
            if token_type_ids is not None:
                token_type_ids = nn.functional.pad(token_type_ids, (0, pad), value=0)
        kwargs = {"token_type_ids": token_type_ids} if token_type_ids is not None else {}
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        return out.last_hidden_state[:, :length]

    @property
    def _pad_token_id(self) -> int:
        return self.backbone.config.pad_token_id or 0

    def _attach_mlm_head(self, trust_remote_code: bool) -> nn.Module:
        """An MLM model whose body IS our backbone, so L_MLM trains the same weights."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mlm_model, loading = AutoModelForMaskedLM.from_pretrained(
                self.model_path, trust_remote_code=trust_remote_code, output_loading_info=True
            )
        head_missing = [
            k for k in loading.get("missing_keys", []) if "predictions" in k or "cls" in k
        ]
        if head_missing or caught and any("newly initialized" in str(w.message) for w in caught):
            log.warning(
                "checkpoint %s has no MLM head: it is randomly initialised (β·L_MLM starts from "
                "a random decoder)",
                self.model_path,
            )
        setattr(mlm_model, mlm_model.base_model_prefix, self.backbone)
        mlm_model.tie_weights()
        return mlm_model

    def pool(self, last_hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(N, L, h) token states → (N, h) sentence vectors."""
        if self.pooler == "mean":
            mask = attention_mask.unsqueeze(-1).to(last_hidden.dtype)  # (N, L, 1)
            return (last_hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        cls = last_hidden[:, 0]
        if self.pooler == "cls":
            return self.backbone.pooler.activation(self.backbone.pooler.dense(cls))
        return cls

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        use_mlp: bool = True,
        mlm_input_ids: torch.Tensor | None = None,
        mlm_attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ):
        """(N, L) token ids → (N, h) pooled vectors (through the MLP head when training with
        one; through the compression head, (N, d) unit rows, when there is one). With
        `mlm_input_ids` (M, L) also returns the MLM logits (M, L, V): one call, so
        DDP sees every parameter used in one forward."""
        hidden = self._run_backbone(input_ids, attention_mask, token_type_ids)
        pooled = self.pool(hidden, attention_mask)
        if use_mlp and self.mlp is not None:
            pooled = self.mlp(pooled)
        if self.compression_head is not None:
            pooled = self.compression_head(pooled)
        if mlm_input_ids is None:
            return pooled
        if self.mlm_model is None:
            raise ValueError("MLM inputs given but the encoder was built without an MLM head")
        logits = self.mlm_model(input_ids=mlm_input_ids, attention_mask=mlm_attention_mask).logits
        return pooled, logits
