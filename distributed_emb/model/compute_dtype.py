"""The number format the torch model multiplies in while it embeds (`embed.compute_dtype`), and
the check that bfloat16 embeds as float32 does.

- ``float32``: the model as trained and saved; every evaluation embeds this way.
- ``bfloat16``: ``torch.autocast`` in bfloat16: matrix products in bfloat16 with float32
  accumulation, softmax and layer norms kept in float32 by autocast's own op lists; the vectors
  come out float32.
- ``auto`` (the embed job's default): bfloat16 where the CPU multiplies bfloat16 matrices in
  hardware (Intel AMX tiles), float32 elsewhere (other CPUs, GPUs).

Why AMX alone: on a 2-core Xeon with AMX, packaged all-MiniLM-L6-v2, `encode` with autocast
embedded 4,000 Wikipedia sentences 2.4× and 300 passages of ~200 tokens 2.4-3× as fast as
float32, with a cosine to the float32 vectors of 0.99998 on average and 0.99997 at worst
(docs/BENCHMARKS.md, "Embedding a corpus"). A CPU without native bfloat16 emulates it, slower
than float32; one with AVX512-BF16 but no AMX was not measured, so it keeps float32 unless
asked (`embed.compute_dtype=bfloat16`).

The check (:class:`PrecisionCheck`): before its first bfloat16 vectors, an embedder embeds the
first `CHECK_ROWS` texts both ways and compares them. Below `MIN_MEAN_COSINE` on average, an
`auto` choice falls back to float32 (logged), and an explicit bfloat16 is refused naming the
figure. The figures go with every block the embedder writes, and so into the manifest.

torch is imported where used: configs name `ComputeDtype` and load without torch.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from distributed_emb.errors import UserInputError
from distributed_emb.scoring import pair_cosines

log = logging.getLogger(__name__)

ComputeDtype = Literal["auto", "float32", "bfloat16"]
COMPUTE_DTYPES = ("auto", "float32", "bfloat16")
# Texts embedded both ways by the check: one batch's worth, a second or two on a CPU.
CHECK_ROWS = 32
# bfloat16 keeps 8 bits of mantissa; with float32 accumulation MiniLM's vectors stayed at a
# cosine of 0.99997 or more. A mean below 0.999 means the model does not take bfloat16 well.
MIN_MEAN_COSINE = 0.999


class PrecisionCheckError(UserInputError):
    """bfloat16 was asked for and its vectors differ from float32's beyond the check's bound."""


def cpu_has_bfloat16_matrices() -> bool:
    """Does this CPU multiply bfloat16 matrices in hardware (AMX tiles)? torch's own probe,
    private in torch 2.x (``torch.cpu._is_amx_tile_supported``); absent, the answer is no."""
    import torch  # startup

    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(probe()) if probe is not None else False


def resolve_compute_dtype(requested: str, device: str) -> str:
    """ "float32" or "bfloat16": what `requested` (COMPUTE_DTYPES) means on `device`."""
    if requested not in COMPUTE_DTYPES:
        raise ValueError(f"compute dtype must be one of {COMPUTE_DTYPES}, got {requested!r}")
    if requested != "auto":
        return requested
    on_cpu = device.split(":")[0] == "cpu"
    return "bfloat16" if on_cpu and cpu_has_bfloat16_matrices() else "float32"


def computing_in(dtype: str, device: str) -> contextlib.AbstractContextManager:
    """The context the forward passes run in: autocast for bfloat16, nothing for float32."""
    if dtype == "float32":
        return contextlib.nullcontext()
    import torch  # startup

    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)


@dataclass(frozen=True)
class PrecisionCheck:
    """The check's figures: cosines between bfloat16 and float32 vectors of `rows` texts."""

    rows: int
    mean_cosine: float
    worst_cosine: float

    @property
    def passed(self) -> bool:
        return self.mean_cosine >= MIN_MEAN_COSINE

    def as_dict(self) -> dict:
        return {
            "rows": self.rows,
            "mean_cosine": round(self.mean_cosine, 6),
            "worst_cosine": round(self.worst_cosine, 6),
            "min_mean_cosine": MIN_MEAN_COSINE,
        }


def check_bfloat16(
    embed_in: Callable[[str, list[str]], np.ndarray], texts: Sequence[str]
) -> PrecisionCheck:
    """Embed the first CHECK_ROWS of `texts` with ``embed_in(dtype, texts)`` in both formats
    and compare them row by row (cosine)."""
    sample = list(texts[:CHECK_ROWS])
    cosines = pair_cosines(embed_in("float32", sample), embed_in("bfloat16", sample))  # (n,)
    return PrecisionCheck(len(sample), float(cosines.mean()), float(cosines.min()))


def settle_after_check(requested: str, check: PrecisionCheck) -> str:
    """The dtype to embed in after `check`: bfloat16 when it passed; float32 when `auto` chose
    bfloat16 and it failed (logged); PrecisionCheckError when bfloat16 was asked for."""
    if check.passed:
        return "bfloat16"
    figure = (
        f"bfloat16's vectors of {check.rows} texts have a mean cosine of "
        f"{check.mean_cosine:.5f} with float32's, below the check's {MIN_MEAN_COSINE}"
    )
    if requested == "bfloat16":
        raise PrecisionCheckError(f"embed.compute_dtype=bfloat16: {figure}; use float32")
    log.warning("embed.compute_dtype=auto: %s; embedding in float32", figure)
    return "float32"
