"""DeepSpeed ZeRO-2 on 2 CPU workers trains like DDP: same losses for the first steps; and its
checkpoints restore without unpickling code (weights-only, a short DeepSpeed allowlist)."""

import json
import os
import socket
from pathlib import Path

import pytest

from distributed_emb.config import TrainingConfig, load_config


@pytest.mark.slow
@pytest.mark.ray
def test_zero2_matches_ddp_losses(ray_local, tiny_run, tmp_path, tiny_bert_path):
    """The session's tiny run (DDP, 2 workers) trained again with DeepSpeed ZeRO-2: the same
    losses, learning rates and dev scores step by step."""
    from harness.tiny_run import tiny_run_config

    from distributed_emb.train.driver import run_training

    ddp_config, _ = tiny_run
    zero_config = tiny_run_config(
        tiny_bert_path,
        tmp_path,
        "train.engine=deepspeed",
        "train.deepspeed.zero_stage=2",
        "output.run_name=zero2",
    )
    ddp = json.loads((Path(ddp_config.output.dir) / "metrics.json").read_text())["history"]
    zero = run_training(zero_config).metrics["history"]
    assert [r["step"] for r in zero] == [0, 1, 2, 3, 4]
    assert zero[0]["stsb_dev_spearman"] == pytest.approx(ddp[0]["stsb_dev_spearman"], abs=1e-6)
    for a, b in zip(ddp[1:], zero[1:], strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4), (a, b)
        assert b["loss_contrastive"] == pytest.approx(a["loss_contrastive"], rel=1e-4)
        assert b["lr"] == pytest.approx(a["lr"], rel=1e-6)
    # Training moved the weights the same way: the dev scores after each step agree.
    for a, b in zip(ddp[1:], zero[1:], strict=True):
        assert b["stsb_dev_spearman"] == pytest.approx(a["stsb_dev_spearman"], abs=0.05)


# --- restoring DeepSpeed checkpoints without unpickling code ----------------------------------


class _RunsCode:
    """Unpickling this calls os.mkdir(path): what a doctored checkpoint could do instead."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.mkdir, (self.path,))


@pytest.fixture(scope="module")
def single_process_group():
    """A one-rank gloo group in this process: what Ray Train gives each worker, minus Ray."""
    import torch.distributed as dist

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    saved = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _engine(seed: int, trust: bool = False, stage: int = 2):
    import torch
    from torch import nn

    from distributed_emb.train.deepspeed_engine import DeepSpeedEngine

    train = load_config(
        TrainingConfig,
        None,
        [
            "train.engine=deepspeed",
            f"train.deepspeed.zero_stage={stage}",
            f"train.deepspeed.trust_checkpoints={str(trust).lower()}",
            "train.batch_size=2",
        ],
    ).train
    torch.manual_seed(seed)
    module = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    return DeepSpeedEngine(module, train, total_steps=10, device=torch.device("cpu"))


def _train_steps(engine, steps: int) -> None:
    import torch

    for _ in range(steps):
        loss = engine.forward_module(torch.randn(2, 8)).pow(2).mean()
        engine.backward(loss)
        engine.step()


def _optimizer_file(checkpoint):
    (path,) = (checkpoint / "deepspeed").glob("*optim_states.pt")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_zero_checkpoint_round_trips_without_pickle(single_process_group, tmp_path, stage):
    import torch

    trained = _engine(seed=0, stage=stage)
    _train_steps(trained, 3)
    trained.save(str(tmp_path / "checkpoint"))

    restored = _engine(seed=1, stage=stage)  # other initial weights, fresh optimizer
    restored.load(str(tmp_path / "checkpoint"))

    assert restored.engine.global_steps == trained.engine.global_steps == 3
    assert restored.lr == pytest.approx(trained.lr)
    # The next step is the one the trained engine takes: same weights and same Adam moments.
    torch.manual_seed(7)
    _train_steps(trained, 1)
    torch.manual_seed(7)
    _train_steps(restored, 1)
    trained_state, restored_state = (
        e.engine.module_state_dict() if stage == 3 else e.module.state_dict()
        for e in (trained, restored)
    )
    for name, value in trained_state.items():
        assert torch.equal(restored_state[name], value), name


@pytest.mark.slow
def test_a_doctored_checkpoint_is_refused_before_its_code_runs(single_process_group, tmp_path):
    import torch

    from distributed_emb.train.deepspeed_engine import UnsafeCheckpointError

    trained = _engine(seed=0)
    _train_steps(trained, 1)
    trained.save(str(tmp_path / "checkpoint"))
    optimizer_file = _optimizer_file(tmp_path / "checkpoint")
    marker = tmp_path / "code_ran"
    state = torch.load(optimizer_file, weights_only=False)  # our own file, just written
    state["note"] = _RunsCode(marker)
    torch.save(state, optimizer_file)

    with pytest.raises(UnsafeCheckpointError) as refused:
        _engine(seed=1).load(str(tmp_path / "checkpoint"))

    assert not marker.exists()
    message = str(refused.value)
    assert message.startswith(f"refusing to restore DeepSpeed checkpoint file {optimizer_file}")
    assert "it needs posix.mkdir" in message  # torch names the global it refused
    assert "train.deepspeed.trust_checkpoints=true" in message

    # The documented way out, for a checkpoint you wrote: DeepSpeed's own pickle loading.
    _engine(seed=1, trust=True).load(str(tmp_path / "checkpoint"))
    assert marker.exists()


def test_a_cpu_engine_compiles_no_inference_op(single_process_group):
    """On a CPU, DeepSpeed compiles its shared-memory all-reduce op (for DeepSpeed-Inference)
    when it sets up communication; the engine tells it not to: no compiler, no 60 core-seconds,
    and training's collectives are torch's, as before."""
    import deepspeed
    import deepspeed.comm.comm as ds_comm

    from distributed_emb.train.deepspeed_engine import SHM_COMM_OP

    engine = _engine(seed=0)
    _train_steps(engine, 1)
    assert ds_comm.cdb is not None and ds_comm.cdb.shm_comm_op is None
    assert deepspeed.ops.__compatible_ops__[SHM_COMM_OP] is False
