"""train.layout=auto and train.precision=auto: what each decides, and that it stays overridable."""

from __future__ import annotations

import torch

from distributed_emb.config import TrainingConfig, load_config
from distributed_emb.model.encoder import TrainableEncoder
from distributed_emb.train.engine import build_engine
from distributed_emb.train.layout import NodeShape, apply_layout, auto_layout
from distributed_emb.train.precision import cpu_may_have_native_bf16, resolve_precision
from distributed_emb.train.train_config import TrainLoopConfig


def test_cpu_node_puts_the_global_batch_in_one_worker_with_every_core():
    train = TrainLoopConfig(num_workers=2, batch_size=32, layout="auto")
    line = apply_layout(train, NodeShape(cpus=2, gpus=0))
    assert (train.num_workers, train.batch_size) == (1, 64)  # the global batch is kept
    assert train.torch_threads == 2
    assert train.cpus_per_worker == 1.0  # one core stays Ray Data's (train.data_cpus)
    assert train.layout == "as_set"  # resolved once
    assert "1 worker × 64" in line


def test_a_bigger_cpu_node_reserves_all_but_the_data_cpus():
    train = TrainLoopConfig(num_workers=4, batch_size=16, layout="auto", torch_threads=3)
    apply_layout(train, NodeShape(cpus=16, gpus=0))
    assert (train.num_workers, train.batch_size, train.cpus_per_worker) == (1, 64, 15.0)
    assert train.torch_threads == 3  # set by the user: kept


def test_gpu_node_gets_one_worker_per_gpu_splitting_the_global_batch():
    train = TrainLoopConfig(num_workers=1, batch_size=256, layout="auto", use_gpu=True)
    apply_layout(train, NodeShape(cpus=32, gpus=4))
    assert (train.num_workers, train.batch_size) == (4, 64)


def test_layouts_that_auto_does_not_touch():
    uneven = TrainLoopConfig(num_workers=1, batch_size=10, use_gpu=True)
    assert auto_layout(uneven, NodeShape(cpus=8, gpus=4))[0] == {}
    several_nodes = TrainLoopConfig(num_workers=2, batch_size=32)
    assert auto_layout(several_nodes, NodeShape(cpus=8, gpus=0, nodes=3))[0] == {}
    as_set = TrainLoopConfig(num_workers=2, batch_size=32)  # the built-in default
    assert apply_layout(as_set, NodeShape(cpus=2, gpus=0)) is None
    assert (as_set.num_workers, as_set.batch_size) == (2, 32)


def test_the_default_job_config_and_its_overrides():
    from harness.jobs import job_module

    DEFAULT_CONFIG = job_module("train_informin").JOB.default_config
    default = load_config(TrainingConfig, str(DEFAULT_CONFIG))
    assert (default.train.layout, default.train.precision) == ("as_set", "auto")
    assert default.data.length_group_batches == 16  # quality held at equal steps
    assert default.train.num_workers * default.train.batch_size == 64
    auto = load_config(
        TrainingConfig, str(DEFAULT_CONFIG), ["train.layout=auto", "train.precision=fp32"]
    )
    apply_layout(auto.train, NodeShape(cpus=2, gpus=0))
    assert (auto.train.num_workers, auto.train.batch_size) == (1, 64)
    assert auto.train.precision == "fp32"


def test_precision_auto_reads_the_cpu_flags(tmp_path):
    avx2 = tmp_path / "avx2"
    avx2.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n")
    amx = tmp_path / "amx"
    amx.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16\n")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16 sve\n")
    assert not cpu_may_have_native_bf16(str(avx2))
    assert cpu_may_have_native_bf16(str(amx))
    assert cpu_may_have_native_bf16(str(arm))
    assert cpu_may_have_native_bf16(str(tmp_path / "missing"))  # unknown: measure instead


def test_explicit_precisions_pass_through_and_auto_becomes_one_of_them():
    cpu = torch.device("cpu")
    for setting in ("fp32", "bf16"):
        assert resolve_precision(setting, cpu) == setting
    assert resolve_precision("auto", cpu) in ("fp32", "bf16")


def test_engine_never_runs_with_auto(tiny_bert_path):
    encoder = TrainableEncoder(tiny_bert_path, pooler="mean", mlp_head=True)
    engine = build_engine(encoder, TrainLoopConfig(precision="auto"), 10, torch.device("cpu"))
    assert engine.precision in ("fp32", "bf16")
    if not cpu_may_have_native_bf16():
        assert engine.precision == "fp32"


def test_the_layout_key_leaves_a_runs_identity_alone():
    from distributed_emb.config import to_dict
    from distributed_emb.train.run_identity import fingerprint

    before = to_dict(TrainingConfig())
    del before["train"]["layout"]  # a run written before the key existed
    after = TrainingConfig()
    after.train.layout = "auto"
    apply_layout(after.train, NodeShape(cpus=2, gpus=0, nodes=3))  # several nodes: as set
    assert fingerprint(before) == fingerprint(to_dict(after))
