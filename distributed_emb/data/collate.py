"""A rank's rows → the tensors one training step needs, in each Ray Train worker.

Training rows arrive as token ids (the indexed shards, data/token_cache.py): the collator only
pads them (dynamic padding: to the longest row in the batch, not max_seq_length), stacks the
views, adds the MLM mask and the groups. Given text instead, it tokenises it with the same
tokenizer call, which is the reference the shards' ids are checked against
(tests/data/test_token_cache.py) and what the benchmarks time on in-memory text.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch

from distributed_emb.data.batches import NO_TOKEN
from distributed_emb.data.corpus import row_columns
from distributed_emb.data.readers import ROW_ID
from distributed_emb.data.tokenize import IDS_SUFFIX, TRUNCATED_SUFFIX

try:  # Ray ≥ 2.47 wants a collate class; the collator also works as a plain callable.
    from ray.data.collate_fn import NumpyBatchCollateFn as _CollateBase  # version
except ImportError:  # pragma: no cover
    _CollateBase = object


# The hard negatives' (B, L) block (data.negative_column), apart from the (2B, L) views that
# the teacher and the MLM copy read.
NEGATIVE_KEYS = ("negative_input_ids", "negative_attention_mask")


class ContrastiveCollator(_CollateBase):
    """Sentences → two views stacked as one (2B, L) batch; pairs → anchors then positives;
    with a negative column, each row's hard negative as a third block of its own.

    Output keys: input_ids, attention_mask (2B, L) with rows [0, B) the first view and [B, 2B)
    the second; `negative_input_ids`/`negative_attention_mask` (B, L) when a negative column
    is set (padded with the views to one L, so the step embeds all 3B rows in one forward);
    `groups` (B,) when a group column is set; `mlm_input_ids`/`mlm_labels` (B, L) when MLM is
    on; `num_truncated` and `num_real_tokens` (scalars, for counting and speed; negatives
    included).
    """

    def __init__(
        self,
        tokenizer,
        max_seq_length: int,
        kind: str = "sentences",
        text_column: str = "text",
        anchor_column: str = "anchor",
        positive_column: str = "positive",
        group_column: str | None = None,
        mlm_probability: float | None = None,
        seed: int = 0,
        negative_column: str | None = None,
    ):
        self.tokenizer = tokenizer
        self.max_seq_length = max_seq_length
        self.kind = kind
        self.text_column = text_column
        self.anchor_column = anchor_column
        self.positive_column = positive_column
        self.group_column = group_column
        self.mlm_probability = mlm_probability
        self.generator = torch.Generator().manual_seed(seed)
        self.negative_column = negative_column
        # The row's texts, then its negative: declared once, in data/corpus.py.
        self.columns = row_columns(
            kind, text_column, anchor_column, positive_column, negative_column
        )

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        columns = self.columns
        encoded = self._encode(batch, columns)
        rows = len(encoded["input_ids"]) // len(columns)
        # One (B, L) block a column, all padded to one L.
        blocks = {
            key: [encoded[key][i * rows : (i + 1) * rows] for i in range(len(columns))]
            for key in ("input_ids", "attention_mask")
        }
        first = {key: parts[0] for key, parts in blocks.items()}
        if self.kind == "sentences":
            out = {k: torch.cat([v, v]) for k, v in first.items()}  # (2B, L): same text twice
        else:
            out = {k: torch.cat(parts[:2]) for k, parts in blocks.items()}  # anchors, positives
        out["num_truncated"] = encoded["num_truncated"]
        out["num_real_tokens"] = out["attention_mask"].sum()
        if self.negative_column is not None:
            ids_key, mask_key = NEGATIVE_KEYS
            out[ids_key], out[mask_key] = blocks["input_ids"][-1], blocks["attention_mask"][-1]
            out["num_real_tokens"] = out["num_real_tokens"] + out[mask_key].sum()
        if ROW_ID in batch:  # which corpus rows this batch trained on (exact resume)
            out["row_ids"] = torch.tensor(np.array(batch[ROW_ID], dtype=np.int64))
        if self.group_column is not None:
            out["groups"] = torch.as_tensor(_group_ids(batch[self.group_column]), dtype=torch.long)
        if self.mlm_probability:
            out["mlm_input_ids"], out["mlm_labels"] = self.mask_tokens(first["input_ids"])
            out["mlm_attention_mask"] = first["attention_mask"]
        return out

    def _encode(self, batch: dict[str, np.ndarray], columns: list[str]) -> dict[str, torch.Tensor]:
        """The columns' rows, one after the other, padded to one length: tokenised here, or
        only padded when Ray Data tokenised them already (data/tokenize.py; token-id matrices
        as batches.numpy_batch makes them)."""
        if all(column + IDS_SUFFIX in batch for column in columns):
            matrices = [batch[column + IDS_SUFFIX] for column in columns]  # each (n, w)
            width = max(m.shape[1] for m in matrices)
            ids = np.concatenate(
                [
                    np.pad(m, ((0, 0), (0, width - m.shape[1])), constant_values=NO_TOKEN)
                    for m in matrices
                ]
            )  # (len(columns)·n, width)
            truncated = sum(int(np.sum(batch[column + TRUNCATED_SUFFIX])) for column in columns)
            return self._pad(ids, truncated)
        return self._tokenize([str(t) for column in columns for t in batch[column]])

    def _pad(self, ids: np.ndarray, truncated: int) -> dict[str, torch.Tensor]:
        """A token-id matrix (NO_TOKEN past each row's end) → (n, longest in this batch)
        input ids with the pad token, and the attention mask."""
        mask = ids != NO_TOKEN  # (n, w)
        longest = int(mask.sum(1).max())
        mask = mask[:, :longest]  # rows are left-aligned: nothing real lies past the longest
        input_ids = np.where(mask, ids[:, :longest], self.tokenizer.pad_token_id).astype(np.int64)
        return {
            "input_ids": torch.from_numpy(input_ids),
            "attention_mask": torch.from_numpy(mask.astype(np.int64)),
            "num_truncated": torch.tensor(truncated),
        }

    def _tokenize(self, texts: list[str]) -> dict[str, torch.Tensor]:
        encoded = self.tokenizer(
            texts,
            padding=True,
            truncation=True,
            max_length=self.max_seq_length,
            return_tensors="pt",
        )
        # Fast tokenizers keep what truncation cut off: count it instead of silently losing it.
        encodings = getattr(encoded, "encodings", None) or []
        truncated = sum(1 for e in encodings if e.overflowing)
        return {
            "input_ids": encoded["input_ids"],
            "attention_mask": encoded["attention_mask"],
            "num_truncated": torch.tensor(truncated),
        }

    def mask_tokens(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """BERT masking: choose `mlm_probability` of real tokens; of those 80% → [MASK],
        10% → random token, 10% unchanged. Labels are −100 elsewhere."""
        labels = input_ids.clone()
        special = torch.tensor(
            [
                self.tokenizer.get_special_tokens_mask(ids, already_has_special_tokens=True)
                for ids in input_ids.tolist()
            ],
            dtype=torch.bool,
        )
        probability = torch.full(labels.shape, self.mlm_probability)
        probability.masked_fill_(special, 0.0)
        chosen = torch.bernoulli(probability, generator=self.generator).bool()
        labels[~chosen] = -100
        masked = input_ids.clone()
        replace = torch.bernoulli(torch.full(labels.shape, 0.8), generator=self.generator).bool()
        replace &= chosen
        masked[replace] = self.tokenizer.mask_token_id
        randomise = torch.bernoulli(torch.full(labels.shape, 0.5), generator=self.generator).bool()
        randomise &= chosen & ~replace
        masked[randomise] = torch.randint(
            len(self.tokenizer), labels.shape, generator=self.generator
        )[randomise]
        return masked, labels


def _group_ids(values) -> np.ndarray:
    """Group labels (document ids, any hashable) → stable int64 ids, equal across workers."""
    return np.array([zlib.crc32(str(v).encode()) for v in values], dtype=np.int64)
