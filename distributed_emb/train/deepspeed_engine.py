"""DeepSpeed ZeRO (stages 0–3) behind the `Engine` interface (train/engine.py).

DeepSpeed is imported inside `DeepSpeedEngine`, in the worker, never on the driver: it fails
to import on some CPU-only machines. On CPU it runs through its CPU accelerator with the gloo
group Ray Train already created.

Choices that differ from DeepSpeed's defaults, on purpose:
- `gradient_clipping` is set from train.max_grad_norm (DeepSpeed 0.19 defaults it to 1.0).
- The optimizer and LR schedule are ours (AdamW, linear warm-up/decay), so DDP and ZeRO runs
  of one config train the same way; `zero_allow_untested_optimizer` allows that under ZeRO.
- A user DeepSpeed JSON (train.deepspeed.config_path) overrides any key we set.
- Checkpoints are restored without unpickling code: DeepSpeed's `.pt` files are pickles that
  its TorchCheckpointEngine loads with weights_only=False; ours loads them with
  weights_only=True, allowing only the plain-data DeepSpeed classes they hold
  (SAFE_DEEPSPEED_GLOBALS). train.deepspeed.trust_checkpoints=true restores DeepSpeed's own
  loading, for checkpoints you wrote yourself that hold something else.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import pickle
import re
from pathlib import Path

import torch
from torch import nn

from distributed_emb import distributed
from distributed_emb.config import merge_trees
from distributed_emb.data.epoch_plan import split_rows
from distributed_emb.train.checkpointing import (
    MODEL_FILE,
    load_encoder_weights,
    save_module_weights,
)
from distributed_emb.train.optim import build_optimizer, build_scheduler
from distributed_emb.train.train_config import TrainLoopConfig

DEEPSPEED_TAG = "deepspeed"

# What DeepSpeed 0.19's ZeRO checkpoints pickle besides tensors, numbers, strings and
# containers (found with torch.serialization.get_unsafe_globals_in_checkpoint, stages 0-3,
# fp32/bf16; the fp16 dynamic scaler is the same kind). Each is a bag of attributes or an
# enum: unpickling sets attributes or looks up a member; no constructor or __setstate__ runs.
SAFE_DEEPSPEED_GLOBALS = (
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.utils.tensor_fragment.fragment_address",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
)
TRUST_KEY = "train.deepspeed.trust_checkpoints"


class UnsafeCheckpointError(RuntimeError):
    """A DeepSpeed checkpoint file needs more than weights-only unpickling to load."""


def _safe_globals() -> list:
    classes = []
    for dotted in SAFE_DEEPSPEED_GLOBALS:
        module, _, name = dotted.rpartition(".")
        classes.append(getattr(importlib.import_module(module), name))
    return classes


def load_weights_only(path: str, map_location=None):
    """torch.load of one DeepSpeed checkpoint file without running code from it."""
    try:
        with torch.serialization.safe_globals(_safe_globals()):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        # torch's message names the refused global ("... unsupported GLOBAL posix.system ...").
        found = re.search(r"GLOBAL ([\w.]+)", str(error))
        needs = found.group(1) if found else "an object weights-only loading refuses"
        raise UnsafeCheckpointError(
            f"refusing to restore DeepSpeed checkpoint file {path}: it needs {needs}, which is "
            f"neither a tensor, plain data nor an allowed DeepSpeed class, and unpickling it "
            f"could run code. If you wrote this checkpoint yourself, set {TRUST_KEY}=true to "
            f"load it with full pickle."
        ) from None


def deepspeed_config(train_config: TrainLoopConfig) -> dict:
    # DeepSpeed wants train_batch_size = micro × accumulation × W with one micro-batch size on
    # every rank, which W ranks holding ⌊G/W⌋ or ⌈G/W⌉ rows cannot meet exactly; both are only
    # its bookkeeping (our steps weight the loss themselves: train/step.py rank_weight), so the
    # micro-batch is the largest slice, rank 0's, the same number on every rank.
    start, stop = split_rows(train_config.global_batch, distributed.world_size(), 0)
    config = {
        "train_micro_batch_size_per_gpu": stop - start,
        "gradient_accumulation_steps": train_config.gradient_accumulation_steps,
        "gradient_clipping": train_config.max_grad_norm or 0.0,
        "zero_optimization": {"stage": train_config.deepspeed.zero_stage},
        "bf16": {"enabled": train_config.precision == "bf16"},
        "fp16": {"enabled": train_config.precision == "fp16"},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if train_config.deepspeed.zero_stage == 3:
        # Export and checkpoints need the full weights gathered on save.
        config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
    if train_config.deepspeed.config_path:
        user = json.loads(Path(train_config.deepspeed.config_path).read_text())
        config = merge_trees(config, user)
    config["train_batch_size"] = (
        config["train_micro_batch_size_per_gpu"]
        * config["gradient_accumulation_steps"]
        * distributed.world_size()
    )
    return config


# DeepSpeed's op that it compiles on a CPU (deepspeed/ops/op_builder/cpu/comm.py).
SHM_COMM_OP = "deepspeed_shm_comm"


def skip_the_inference_all_reduce_build(deepspeed) -> None:
    """On a CPU, DeepSpeed compiles a C++ op (deepspeed_shm_comm) with the machine's compiler
    when it sets up its communication (deepspeed/comm/torch.py, build_shm_op), unless its table
    of compatible ops says no. The op serves DeepSpeed-Inference's `inference_all_reduce` alone,
    which training never calls, and the build needs g++ on every node and took 60 core-seconds
    (once per extensions directory). Marked incompatible here; the table is DeepSpeed's own,
    so a release without it (or without the op) is left as it is."""
    compatible = getattr(getattr(deepspeed, "ops", None), "__compatible_ops__", None)
    if isinstance(compatible, dict) and SHM_COMM_OP in compatible:
        compatible[SHM_COMM_OP] = False


class DeepSpeedEngine:
    def __init__(
        self,
        module: nn.Module,
        train_config: TrainLoopConfig,
        total_steps: int,
        device: torch.device,
    ):
        import deepspeed  # optional

        if device.type == "cpu":
            skip_the_inference_all_reduce_build(deepspeed)
        self.module = module.to(device)
        self.device = device
        self.config = deepspeed_config(train_config)
        self.zero_stage = self.config["zero_optimization"]["stage"]
        optimizer = build_optimizer(module, train_config)
        scheduler = build_scheduler(optimizer, total_steps, train_config)
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=module, optimizer=optimizer, lr_scheduler=scheduler, config=self.config
        )
        self.forward_module = self.engine
        self.trust_checkpoints = train_config.deepspeed.trust_checkpoints
        if not self.trust_checkpoints:
            # Every ZeRO stage 0-3 restore reads its files through engine.checkpoint_engine.load
            # (model states via the SD loader, optimizer partitions, ZeRO-3 shards; only MoE
            # experts, which this project never builds, bypass it). An instance attribute
            # replaces DeepSpeed's pickle load there; saves are unchanged.
            self.engine.checkpoint_engine.load = load_weights_only

    def autocast(self):
        # bf16/fp16 in DeepSpeed cast the parameters themselves; no autocast on top.
        return contextlib.nullcontext()

    def no_sync(self):
        # DeepSpeed reduces at its own accumulation boundary.
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)  # DeepSpeed scales by 1/gradient_accumulation_steps itself
        if not self.engine.is_gradient_accumulation_boundary():
            # DeepSpeed counts micro-batches in step(); it updates only at the boundary.
            self.engine.step()

    def mini_batch_scope(self, last: bool, synchronise: bool):
        # The last mini-batch is the loop's micro-batch as DeepSpeed counts it: the engine's own
        # boundary (and its wrapper's accumulation bookkeeping) apply unchanged. The earlier
        # ones run with the boundary off, DeepSpeed's documented way to add backward calls
        # inside one optimizer step (no_sync() itself is refused at ZeRO >= 2).
        return contextlib.nullcontext() if last else self._no_boundary()

    @contextlib.contextmanager
    def _no_boundary(self):
        self.engine.set_gradient_accumulation_boundary(False)
        try:
            yield
        finally:
            # None: DeepSpeed decides the boundary from its micro-step counter again (the
            # engine's state outside this scope: only this scope ever sets it).
            self.engine.set_gradient_accumulation_boundary(None)

    def mini_batch_backward(self, loss: torch.Tensor, last: bool) -> None:
        if last:
            self.backward(loss)
        else:
            # The wrapper's backward advances DeepSpeed's micro-step counter once per loop
            # micro-batch; the earlier mini-batches must not count as micro-batches.
            self.engine.backward(loss)

    def step(self) -> None:
        self.engine.step()

    @property
    def lr(self) -> float:
        return self.engine.get_lr()[0]

    @property
    def saves_on_every_rank(self) -> bool:
        return True  # ZeRO partitions optimizer state (and parameters at stage 3) by rank

    def save(self, directory: str) -> None:
        """Every rank writes its ZeRO shards (Ray merges the ranks' files into one checkpoint);
        rank 0 also writes the full weights as safetensors for export."""
        self.engine.save_checkpoint(directory, tag=DEEPSPEED_TAG)
        if self.zero_stage == 3:
            state = self.engine._zero3_consolidated_16bit_state_dict()  # collective
        else:
            state = self.module.state_dict()
        if distributed.rank() == 0:
            save_module_weights(
                {k: v.float() for k, v in state.items()}, str(Path(directory) / MODEL_FILE)
            )

    def load(self, directory: str) -> None:
        if (Path(directory) / DEEPSPEED_TAG).exists():
            if self.engine.load_universal_checkpoint() and not self.trust_checkpoints:
                # Universal checkpoints are read with torch.load(weights_only=False) directly,
                # past the checkpoint engine.
                raise UnsafeCheckpointError(
                    f"refusing to restore {directory}: DeepSpeed loads universal checkpoints "
                    f"(checkpoint.load_universal in the DeepSpeed config) with full pickle; "
                    f"set {TRUST_KEY}=true if you wrote this checkpoint yourself"
                )
            self.engine.load_checkpoint(directory, tag=DEEPSPEED_TAG)
        else:  # a DDP checkpoint: weights only, fresh optimizer
            load_encoder_weights(self.module, directory)
