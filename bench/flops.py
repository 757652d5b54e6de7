"""Model FLOPs of a BERT-style encoder training step, and the machine's dense matmul rate.

MFU (model-FLOPs utilisation, as in PaLM, Chowdhery et al. 2022, appendix B) counts only the
FLOPs the model needs for the *real* tokens: padding is work the hardware did but the model
did not need, so it lowers MFU instead of raising it.

Per real token of a sequence of length L, per layer, forward:
    8·h²        Q, K, V and output projections (4 matmuls of h×h, 2 FLOPs per MAC)
    4·h·f       the feed-forward in and out (h×f and f×h)
    4·L·h       attention scores QKᵀ and the weighted sum AV
Training is 3 × forward (backward computes the input and the weight gradients). The pooler,
the training MLP head, the loss (B×B logits) and the embedding lookups are under 1% at
MiniLM's size and are left out, as is usual.
"""

from __future__ import annotations

import time

import torch


def training_flops_per_token(hidden: int, layers: int, ffn: int, context: float) -> float:
    """Forward + backward FLOPs for one token attending over `context` tokens."""
    forward = layers * (8 * hidden * hidden + 4 * hidden * ffn + 4 * context * hidden)
    return 3.0 * forward


def training_flops(config, lengths: list[int] | torch.Tensor) -> float:
    """Model FLOPs of one training step over sequences of these real lengths (each sequence
    attends over its own length)."""
    lengths = torch.as_tensor(lengths, dtype=torch.float64)
    h, layers, f = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    per_token_fixed = training_flops_per_token(h, layers, f, context=0.0)
    attention = 3.0 * layers * 4 * h * float((lengths * lengths).sum())
    return per_token_fixed * float(lengths.sum()) + attention


def matmul_flops_per_s(threads: int, size: int = 1024, seconds: float = 1.0) -> float:
    """Best fp32 dense matmul rate (FLOP/s) of `size`×`size` products over ~`seconds`, with
    `threads` torch threads: the ceiling the training step is compared against."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randn(size, size)
        b = torch.randn(size, size)
        out = torch.empty(size, size)
        torch.mm(a, b, out=out)  # warm-up: MKL picks its kernels on the first call
        best = 0.0
        deadline = time.perf_counter() + seconds
        while True:
            started = time.perf_counter()
            torch.mm(a, b, out=out)
            elapsed = time.perf_counter() - started
            best = max(best, 2.0 * size**3 / elapsed)
            if time.perf_counter() > deadline:
                return best
    finally:
        torch.set_num_threads(previous)
