"""The engine interface (`Engine`) and its DDP implementation; DeepSpeed ZeRO is the other
(train/deepspeed_engine.py). Which engine runs is configuration (`train.engine`).

The loop and the steps only call what `Engine` names: `forward_module` (what to run the batch
through), `autocast()`, `backward(loss)`, `step()` (clip, optimizer, scheduler, zero grad),
`no_sync()` (accumulate without all-reduce), `save(dir)`, `load(dir)`, `lr`; GradCache
(train/grad_cache.py) runs several backward passes inside one micro-batch through
`mini_batch_scope` and `mini_batch_backward`. Optimizer and schedule: train/optim.py; weight
files: train/checkpointing.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from distributed_emb import distributed
from distributed_emb.train.checkpointing import (
    MODEL_FILE,
    load_encoder_weights,
    save_module_weights,
)
from distributed_emb.train.deepspeed_engine import DeepSpeedEngine
from distributed_emb.train.optim import build_optimizer, build_scheduler
from distributed_emb.train.precision import resolve_precision
from distributed_emb.train.train_config import TrainLoopConfig

OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
FUSED_ADAMW_DEVICES = ("cpu", "cuda")


class Engine(Protocol):
    """What a data-parallel engine gives the loop and the steps."""

    module: nn.Module  # the encoder itself (weights, export)
    forward_module: nn.Module  # what a batch runs through (the DDP / DeepSpeed wrapper)

    def autocast(self) -> ContextManager: ...

    def no_sync(self) -> ContextManager:
        """Accumulate this backward's gradients locally (a loop micro-batch before the last)."""
        ...

    def backward(self, loss: torch.Tensor) -> None: ...

    def step(self) -> None: ...

    def mini_batch_scope(self, last: bool, synchronise: bool) -> ContextManager:
        """Around one GradCache mini-batch's backward: `last` is the micro-batch's final
        mini-batch, `synchronise` whether its gradients must be all-reduced now."""
        ...

    def mini_batch_backward(self, loss: torch.Tensor, last: bool) -> None:
        """Backward of one GradCache mini-batch (only the last counts as a micro-batch)."""
        ...

    @property
    def lr(self) -> float: ...

    @property
    def saves_on_every_rank(self) -> bool: ...

    def save(self, directory: str) -> None: ...

    def load(self, directory: str) -> None: ...


def autocast_dtype(precision: str) -> torch.dtype | None:
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


class DDPEngine:
    """torch DistributedDataParallel (gloo on CPU, nccl on GPU) + AdamW + linear schedule."""

    def __init__(
        self,
        module: nn.Module,
        train_config: TrainLoopConfig,
        total_steps: int,
        device: torch.device,
    ):
        self.module = module.to(device)
        self.device = device
        self.precision = train_config.precision
        self.max_grad_norm = train_config.max_grad_norm
        self.accumulation_steps = train_config.gradient_accumulation_steps
        if distributed.world_size() > 1:
            device_ids = [device.index] if device.type == "cuda" else None
            self.forward_module = nn.parallel.DistributedDataParallel(
                self.module, device_ids=device_ids
            )
        else:
            self.forward_module = self.module
        self.optimizer = build_optimizer(
            self.module, train_config, fused=device.type in FUSED_ADAMW_DEVICES
        )
        self.scheduler = build_scheduler(self.optimizer, total_steps, train_config)
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

    def mini_batch_scope(self, last: bool, synchronise: bool):
        return contextlib.nullcontext() if synchronise else self.no_sync()

    def mini_batch_backward(self, loss: torch.Tensor, last: bool) -> None:
        self.backward(loss)

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
        (path / "engine.json").write_text(json.dumps({"engine": "ddp"}))

    def load(self, directory: str) -> None:
        path = Path(directory)
        load_encoder_weights(self.module, str(path))
        self.optimizer.load_state_dict(torch.load(path / OPTIMIZER_FILE, weights_only=True))
        self.scheduler.load_state_dict(torch.load(path / SCHEDULER_FILE, weights_only=True))

    @property
    def saves_on_every_rank(self) -> bool:
        return False


def build_engine(
    module: nn.Module, train_config: TrainLoopConfig, total_steps: int, device: torch.device
) -> Engine:
    """The configured engine; `train.precision=auto` is decided here, for `device`."""
    precision = resolve_precision(train_config.precision, device)
    if precision != train_config.precision:
        train_config = dataclasses.replace(train_config, precision=precision)
    if train_config.engine == "ddp":
        return DDPEngine(module, train_config, total_steps, device)
    if train_config.engine == "deepspeed":
        return DeepSpeedEngine(module, train_config, total_steps, device)
    raise ValueError(f"unknown engine {train_config.engine!r}")
