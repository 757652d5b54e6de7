"""`train.precision=auto`: bf16 autocast where the hardware makes it faster, else fp32.

- CUDA: bf16 when the GPU supports it (Ampere and later), else fp32 (fp16 needs loss scaling
  and stays an explicit choice).
- CPU: fp32 when the CPU lists no native bf16 instructions (x86 without AVX512-BF16 or AMX:
  bf16 is emulated there, 15× slower per step on an AVX2 machine, docs/BENCHMARKS.md);
  otherwise measured at start-up by rank 0 (a fraction of a second; its choice is broadcast, so
  every rank trains in the same precision, train/worker.py): an encoder-sized
  linear layer, forward and backward, fp32 against bf16 autocast, bf16 taken only when it is
  clearly faster (×1.25; a 2-core EPYC with AVX512-BF16 ran the whole step 1.67× faster).
Losses stay in fp32 either way (train/step.py).
"""

from __future__ import annotations

import time

import torch

# bf16 must beat fp32 by this much to be chosen: a near-tie is not worth the rounding.
MIN_SPEEDUP = 1.25


def resolve_precision(setting: str, device: torch.device) -> str:
    """The precision `setting` means on `device`: itself, or auto's choice."""
    if setting != "auto":
        return setting
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    if device.type == "cpu":
        if not cpu_may_have_native_bf16():
            return "fp32"
        return "bf16" if cpu_bf16_speedup() >= MIN_SPEEDUP else "fp32"
    return "fp32"


NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86 (two kinds), ARM (bf16)


def cpu_may_have_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """False when the CPU's flags are readable and name no bf16 instructions; True when they
    do, or cannot be read (then the measurement decides)."""
    try:
        with open(cpuinfo) as info:
            flags = set()
            for line in info:
                key = line.split(":", 1)[0].strip().lower()
                if key in ("flags", "features"):
                    flags.update(line.split(":", 1)[1].split())
    except OSError:
        return True
    if not flags:
        return True
    return any(flag in flags for flag in NATIVE_BF16_FLAGS)


def cpu_bf16_speedup(rows: int = 256, width: int = 384, repeats: int = 3) -> float:
    """fp32 seconds / bf16-autocast seconds of a (rows × width) → 4·width linear layer's
    forward and backward on this CPU, best of `repeats` each (one warm-up call each)."""
    layer = torch.nn.Linear(width, 4 * width)
    inputs = torch.randn(rows, width, requires_grad=True)

    def once(bf16: bool) -> float:
        started = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = layer(inputs)
        out.float().sum().backward()
        return time.perf_counter() - started

    best = {}
    for bf16 in (False, True):
        once(bf16)
        best[bf16] = min(once(bf16) for _ in range(repeats))
    return best[False] / max(best[True], 1e-9)
