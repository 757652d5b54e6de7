"""The compression head: an MLP from the frozen encoder's vector to a small normalised one.

Only ``Linear`` layers and element-wise activations, so the head exports exactly as a stack of
sentence-transformers ``Dense`` modules followed by ``Normalize`` (see
``mcr2/export_with_head.py``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

ACTIVATIONS: dict[str, type[torch.nn.Module]] = {
    "relu": torch.nn.ReLU,
    "gelu": torch.nn.GELU,
    "tanh": torch.nn.Tanh,
    "silu": torch.nn.SiLU,
    "identity": torch.nn.Identity,
}


def make_activation(name: str) -> torch.nn.Module:
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; expected one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]()


class CompressionHead(torch.nn.Module):
    """input_dim → hidden_dims… → output_dim, activation between layers, L2-normalised output.

    forward: (n, input_dim) → (n, output_dim) with unit rows. Dropout (training only) follows
    each hidden activation; at inference the head is exactly its Linear/activation stack.
    """

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        hidden_dims: list[int] | tuple[int, ...] = (512,),
        activation: str = "gelu",
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        sizes = [input_dim, *hidden_dims, output_dim]
        if any(s <= 0 for s in sizes):
            raise ValueError(f"head layer sizes must be positive, got {sizes}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"head dropout must be in [0, 1), got {dropout}")
        self.linears = torch.nn.ModuleList(
            torch.nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True)
        )
        self.activation_name = activation
        self.activation = make_activation(activation)
        self.dropout = torch.nn.Dropout(dropout)

    @property
    def output_dim(self) -> int:
        return self.linears[-1].out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for linear in self.linears[:-1]:
            x = self.dropout(self.activation(linear(x)))  # (n, hidden)
        return F.normalize(self.linears[-1](x), dim=1)  # (n, output_dim)

    def start_at_projection(self, mean: np.ndarray, components: np.ndarray) -> None:
        """Set a linear head to x ↦ (x − mean)·componentsᵀ, e.g. PCA's map: weight =
        components (output_dim, input_dim), bias = −components·mean."""
        if len(self.linears) != 1:
            raise ValueError("only a linear head (no hidden layers) can start at a projection")
        linear = self.linears[0]
        components = np.asarray(components, dtype=np.float32)
        if components.shape != tuple(linear.weight.shape):
            raise ValueError(
                f"projection of shape {components.shape} does not fit the head's "
                f"{tuple(linear.weight.shape)} weight"
            )
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(components))
            linear.bias.copy_(torch.from_numpy(-components @ np.asarray(mean, np.float32)))

    def layers_for_export(self) -> list[tuple[torch.nn.Linear, torch.nn.Module | None]]:
        """(linear, activation) per layer; the last layer has none (Normalize follows)."""
        last = len(self.linears) - 1
        return [
            (linear, None if i == last else make_activation(self.activation_name))
            for i, linear in enumerate(self.linears)
        ]


# An exported head's files (mcr2/export_with_head.py): its weights, and its shape and training
# record.
HEAD_WEIGHTS_FILE = "compression_head.safetensors"
HEAD_INFO_FILE = "mcr2_head.json"


def save_head(head: CompressionHead, directory: str | os.PathLike, info: dict) -> None:
    """The head's weights and `info` (which must hold its shape: output_dim, hidden_dims,
    activation) into `directory`, so `load_head` can rebuild it to fine-tune end to end."""
    directory = Path(directory)
    state = {k: v.detach().contiguous() for k, v in head.state_dict().items()}
    save_file(state, str(directory / HEAD_WEIGHTS_FILE))
    (directory / HEAD_INFO_FILE).write_text(json.dumps(info, indent=1, sort_keys=True))


def read_head_info(directory: str | os.PathLike) -> dict:
    """The saved head's ``mcr2_head.json``: its shape, the encoder and pooler it read, and its
    training record."""
    return json.loads((Path(directory) / HEAD_INFO_FILE).read_text())


def load_head(directory: str | os.PathLike) -> CompressionHead:
    """The head saved in `directory` (an MCR² export, ``models/mcr2-<dim>``), in train mode."""
    directory = Path(directory)
    weights, info_file = directory / HEAD_WEIGHTS_FILE, directory / HEAD_INFO_FILE
    for path in (weights, info_file):
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} is missing: model.compression_head must be a directory written by "
                "jobs/train_mcr2.py (models/mcr2-<dim>)"
            )
    info = read_head_info(directory)
    state = load_file(str(weights))
    head = CompressionHead(
        int(state["linears.0.weight"].shape[1]),
        int(info["output_dim"]),
        list(info.get("hidden_dims", [])),
        info.get("activation", "gelu"),
    )
    head.load_state_dict(state, strict=True)
    return head
