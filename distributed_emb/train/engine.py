"""One interface over the ways to run data-parallel training: DDP here, DeepSpeed ZeRO beside it.

The loop only calls: `forward_module` (what to run the batch through), `autocast()`,
`backward(loss)`, `step()` (clip, optimizer, scheduler, zero grad), `no_sync()` (accumulate
without all-reduce), `save(dir)`, `load(dir)` and `lr`. Which engine runs is configuration.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch
from torch import nn

from distributed_emb import distributed

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
FUSED_ADAMW_DEVICES = ("cpu", "cuda")


def build_optimizer(
    module: nn.Module, learning_rate: float, weight_decay: float, fused: bool = False
):
    """AdamW; `fused=True` updates all parameters in one kernel (on CPU ~8× faster than the
    default per-parameter loop for MiniLM, see docs/BENCHMARKS.md), same math."""
    # No decay on biases and LayerNorm weights (BERT/SimCSE convention).
    decay, no_decay = [], []
    for name, parameter in module.named_parameters():
        if not parameter.requires_grad:
            continue
        (no_decay if parameter.ndim < 2 or "LayerNorm" in name else decay).append(parameter)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=learning_rate, fused=fused or None)


def build_scheduler(optimizer, total_steps: int, warmup_ratio: float):
    """Linear warm-up then linear decay to 0 over `total_steps` optimizer steps."""
    warmup = int(total_steps * warmup_ratio)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def autocast_dtype(precision: str) -> torch.dtype | None:
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


class DDPEngine:
    """torch DistributedDataParallel (gloo on CPU, nccl on GPU) + AdamW + linear schedule."""

    name = "ddp"

    def __init__(self, module: nn.Module, train_config, total_steps: int, device: torch.device):
        self.module = module.to(device)
        self.device = device
        self.precision = train_config.precision
        self.max_grad_norm = train_config.max_grad_norm
        self.accumulation_steps = getattr(train_config, "gradient_accumulation_steps", 1)
        if distributed.world_size() > 1:
            device_ids = [device.index] if device.type == "cuda" else None
            self.forward_module = nn.parallel.DistributedDataParallel(
                self.module, device_ids=device_ids
            )
        else:
            self.forward_module = self.module
        self.optimizer = build_optimizer(
            self.module,
            train_config.learning_rate,
            train_config.weight_decay,
            fused=device.type in FUSED_ADAMW_DEVICES,
        )
        self.scheduler = build_scheduler(self.optimizer, total_steps, train_config.warmup_ratio)
        # fp16 needs loss scaling; bf16 and fp32 do not.
        self.scaler = torch.amp.GradScaler("cuda") if self.precision == "fp16" else None

    def autocast(self):
        dtype = autocast_dtype(self.precision)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def no_sync(self):
        """Accumulate gradients locally; the next backward outside this context all-reduces."""
        if isinstance(self.forward_module, nn.parallel.DistributedDataParallel):
            return self.forward_module.no_sync()
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        # Accumulated micro-batches average, as one batch of their combined size would.
        loss = loss / self.accumulation_steps
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()

    def step(self) -> None:
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.max_grad_norm)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    @property
    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    # Checkpoints: safetensors for weights (no pickle); optimizer/scheduler state dicts hold only
    # tensors and numbers, and are loaded with weights_only=True.
    def save(self, directory: str) -> None:
        path = Path(directory)
        save_module_weights(self.module.state_dict(), str(path / MODEL_FILE))
        torch.save(self.optimizer.state_dict(), path / OPTIMIZER_FILE)
        torch.save(self.scheduler.state_dict(), path / SCHEDULER_FILE)
        (path / "engine.json").write_text(json.dumps({"engine": self.name}))

    def load(self, directory: str) -> None:
        path = Path(directory)
        load_encoder_weights(self.module, str(path))
        self.optimizer.load_state_dict(torch.load(path / OPTIMIZER_FILE, weights_only=True))
        self.scheduler.load_state_dict(torch.load(path / SCHEDULER_FILE, weights_only=True))

    @property
    def saves_on_every_rank(self) -> bool:
        return False


def build_engine(module: nn.Module, train_config, total_steps: int, device: torch.device):
    if train_config.engine == "ddp":
        return DDPEngine(module, train_config, total_steps, device)
    if train_config.engine == "deepspeed":
        # Imported here: deepspeed fails to import on some CPU-only drivers.
        from distributed_emb.train.deepspeed_engine import DeepSpeedEngine

        return DeepSpeedEngine(module, train_config, total_steps, device)
    raise ValueError(f"unknown engine {train_config.engine!r}")


def save_module_weights(state_dict: dict, path: str) -> None:
    """safetensors, every key stored (tied weights as copies): loads with no pickle."""
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous().cpu().clone() for k, v in state_dict.items()}, path)


def load_encoder_weights(module: nn.Module, checkpoint_dir: str) -> None:
    """Weights only (for export, evaluation and resume), whichever engine saved them."""
    from safetensors.torch import load_file

    state = load_file(str(Path(checkpoint_dir) / MODEL_FILE))
    module.load_state_dict(state, strict=True)
