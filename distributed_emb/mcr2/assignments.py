"""Cluster assignments Π for MCR²: given by the user (a column) or learned by a small head.

- From a column: any hashable values (document ids, IDC cluster ids, labels) become integer
  cluster ids, which the loss groups by index (hard Π).
- Learned: a linear layer + softmax over k clusters on the compressed vectors, trained jointly
  with the compression head: the MCR² paper's Π "learned by the architecture" (soft Π). Its
  trivial choices are the worst for the objective (one cluster, or uniform Π, both give
  R_c = R), so minimising R_c drives it towards a real partition.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch


def cluster_ids_from_column(values: Sequence, column: str = "cluster") -> tuple[np.ndarray, list]:
    """Map a column's values to cluster ids 0..k−1 in order of first appearance.

    Returns (ids (n,) int64, the distinct values in id order). A missing value (None or NaN)
    is an error naming the column and row, since dropping it would misalign the embeddings.
    """
    index: dict = {}
    ids = np.empty(len(values), dtype=np.int64)
    for row, value in enumerate(values):
        if value is None or (isinstance(value, float) and math.isnan(value)):
            raise ValueError(f"cluster column {column!r}, row {row}: missing value")
        if isinstance(value, np.generic):
            value = value.item()
        ids[row] = index.setdefault(value, len(index))
    return ids, list(index)


class SoftAssignmentHead(torch.nn.Module):
    """Π = softmax(W·z / τ): (n, dim) compressed vectors → (n, num_clusters) probabilities."""

    def __init__(self, dim: int, num_clusters: int, temperature: float = 1.0) -> None:
        super().__init__()
        if num_clusters < 2:
            raise ValueError(f"a learned assignment needs ≥ 2 clusters, got {num_clusters}")
        if temperature <= 0:
            raise ValueError(f"assignment temperature must be > 0, got {temperature}")
        self.linear = torch.nn.Linear(dim, num_clusters)
        self.temperature = temperature

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.linear(z) / self.temperature, dim=1)  # (n, k)
