"""What a training checkpoint holds: the encoder's weights (model.safetensors, written and read
here for every engine), the loop's position (step, epoch, batches consumed in the epoch), the
RNG states, the config and the run's identity (run_identity.json: the fingerprint of the
settings that define the run). The engines add their optimizer and scheduler state.

Everything is JSON, safetensors or plain tensors loaded with weights_only=True: a checkpoint
from shared storage can never run code when it is loaded.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from distributed_emb.train.run_identity import (
    CONFIG_FILE,
    IDENTITY_FILE,
    STATE_FILE,
    identity_record,
)

RNG_FILE = "rng.pt"
MODEL_FILE = "model.safetensors"


def save_module_weights(state_dict: dict, path: str) -> None:
    """safetensors, every key stored (tied weights as copies): loads with no pickle."""
    save_file({k: v.detach().contiguous().cpu().clone() for k, v in state_dict.items()}, path)


def load_encoder_weights(module: nn.Module, checkpoint_dir: str) -> None:
    """Weights only (for export, evaluation and resume), whichever engine saved them."""
    state = load_file(str(Path(checkpoint_dir) / MODEL_FILE))
    module.load_state_dict(state, strict=True)


@dataclass
class LoopState:
    step: int = 0  # optimizer steps done
    epoch: int = 0
    batches_in_epoch: int = 0  # this rank's batches consumed in the current epoch
    sentences_seen: int = 0  # global
    truncated: int = 0  # rows cut by max_seq_length, global
    restarts: int = 0  # times this run resumed from a checkpoint after a failure
    history: list[dict] = field(default_factory=list)  # evaluations so far
    # Where the next global batch starts (data/epoch_plan.py DataPosition, as a dict): all a
    # resumed or resized run needs to continue the epoch exactly.
    position: dict = field(default_factory=dict)
    # The stream that position indexes (data/training_stream.py TrainingStream.identity): a resume
    # onto another stream is refused rather than applied to other rows.
    stream: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> LoopState:
        return cls(**json.loads(text))


def capture_rng() -> dict:
    # random.getstate() is (int, tuple of ints, float | None): loadable with weights_only.
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_loop_state(directory: str, state: LoopState, config: dict, rank: int) -> None:
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    # RNG differs per rank (different dropout masks per worker); the rest is rank 0's.
    torch.save(capture_rng(), path / f"rank{rank}_{RNG_FILE}")
    if rank == 0:
        (path / STATE_FILE).write_text(state.to_json())
        (path / CONFIG_FILE).write_text(json.dumps(config, indent=2))
        # The run's fingerprint: the driver compares it with a new run under the same name
        # before resuming (run_identity.prepare_run).
        (path / IDENTITY_FILE).write_text(json.dumps(identity_record(config), indent=2))


def load_loop_state(directory: str, rank: int) -> LoopState:
    path = Path(directory)
    state = LoopState.from_json((path / STATE_FILE).read_text())
    rng_file = path / f"rank{rank}_{RNG_FILE}"
    if rng_file.exists():
        restore_rng(torch.load(rng_file, weights_only=True))
    return state
