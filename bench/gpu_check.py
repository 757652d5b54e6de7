"""GPU check: InforMin-CL training-step throughput and MFU on one GPU: DDP in bf16 and in
fp32 (TF32 matmuls), DDP with the encoder compiled (`train.compile=true`; warm-up steps absorb
the compiling), DeepSpeed ZeRO-2.

Randomly initialised encoders (no weights needed) of BERT-base's shape and of the default
encoder's (all-MiniLM-L6-v2: 384 wide, 6 layers), seq 32, per-GPU batch 128 and 512 (each
step embeds 2B sequences: two dropout views), the project's real step
(train/step.py) through the project's engines (train/engine.py, train/deepspeed_engine.py).
The bf16 dense-matmul rate is measured in the same run and MFU is reported against it and
against the datasheet peak.

    bash bench/gpu_check.sh            # on a GPU machine; prints the table last
    python -m bench.gpu_check --tiny --device cpu   # a seconds-long smoke run anywhere
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from distributed_emb.losses.loss_config import LossConfig
from distributed_emb.model.encoder import TrainableEncoder
from distributed_emb.train.step import plain_step
from distributed_emb.train.train_config import TrainLoopConfig

DATASHEET_BF16_TFLOPS = 989.0  # H100/H200 SXM dense bf16


# (hidden, layers, heads, intermediate) of the encoders measured: BERT-base, and the shape of
# the product's default encoder (all-MiniLM-L6-v2); "tiny" for the CPU smoke run.
SHAPES = {
    "base": (768, 12, 12, 3072),
    "minilm": (384, 6, 12, 1536),
    "tiny": (64, 2, 2, 128),
}


def bert_dir(shape: str) -> str:
    from transformers import BertConfig, BertModel

    hidden, layers, heads, intermediate = SHAPES[shape]
    config = BertConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        vocab_size=30522,
    )
    directory = tempfile.mkdtemp(prefix="bert_random_")
    torch.manual_seed(0)
    BertModel(config).save_pretrained(directory)
    return directory


def training_flops_per_step(config, batch: int, seq: int) -> float:
    """Forward+backward FLOPs (3 × forward) for 2·batch sequences of `seq` tokens: matmuls in
    the layers and the attention scores/values; embeddings and softmax ignored (the usual
    MFU accounting)."""
    h, layers, ffn = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    tokens = 2 * batch * seq
    per_token_layer = 2 * (4 * h * h + 2 * h * ffn)  # QKV+O projections, FFN in/out
    attention = 2 * 2 * seq * h  # QKᵀ and AV per token per layer
    mlp_head = 2 * h * h / seq  # the training MLP, once per sequence
    forward = tokens * (layers * (per_token_layer + attention) + mlp_head)
    return 3 * forward


def matmul_tflops(device: torch.device, n: int, dtype=torch.bfloat16) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    repeats = 10
    started = time.perf_counter()
    for _ in range(repeats):
        a @ b
    sync(device)
    return 2 * n**3 * repeats / (time.perf_counter() - started) / 1e12


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_case(
    engine_name: str,
    model_dir: str,
    batch: int,
    seq: int,
    steps: int,
    warmup: int,
    device: torch.device,
    precision: str,
) -> dict:
    from distributed_emb.train.engine import build_engine

    torch.manual_seed(0)
    # "ddp+compile": DDP, compiled encoder; "ddp+fp32": DDP without autocast (TF32 matmuls)
    engine_base, _, variant = engine_name.partition("+")
    if variant == "fp32":
        precision = "fp32"
    encoder = TrainableEncoder(model_dir, pooler="cls_before_pooler", mlp_head=True)
    encoder.train()
    if variant == "compile":
        encoder.compile_backbone()  # what train.compile=true does
    train = TrainLoopConfig(
        batch_size=batch, precision=precision, engine="ddp" if engine_base == "ddp" else "deepspeed"
    )
    train.deepspeed.zero_stage = 2
    engine = build_engine(encoder, train, total_steps=steps + warmup, device=device)
    weights = LossConfig(temperature=0.05, reconstruction_weight=0.1)
    vocab = encoder.backbone.config.vocab_size
    ids = torch.randint(1000, vocab, (batch, seq), device=device)
    batch_tensors = {
        "input_ids": torch.cat([ids, ids]),
        "attention_mask": torch.ones(2 * batch, seq, dtype=torch.long, device=device),
    }
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(warmup):
        plain_step(engine, batch_tensors, weights, sync=True)
        engine.step()
    sync(device)
    started = time.perf_counter()
    for _ in range(steps):
        plain_step(engine, batch_tensors, weights, sync=True)
        engine.step()
    sync(device)
    seconds = (time.perf_counter() - started) / steps
    flops = training_flops_per_step(encoder.backbone.config, batch, seq)
    peak_memory = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    del engine, encoder
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {
        "engine": engine_name,
        "batch": batch,
        "step_s": seconds,
        "sentences_per_s": batch / seconds,
        "tflops": flops / seconds / 1e12,
        "peak_gib": peak_memory,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--batches", default="128,512")
    parser.add_argument("--engines", default="ddp,ddp+fp32,ddp+compile,zero2")
    parser.add_argument("--shapes", default="base", help=f"comma-separated of {sorted(SHAPES)}")
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(0)
        torch.backends.cuda.matmul.allow_tf32 = True
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    precision = "bf16"
    measured = matmul_tflops(device, 256 if args.tiny else 8192)
    shapes = ["tiny"] if args.tiny else args.shapes.split(",")
    rows = []
    for shape in shapes:
        model_dir = bert_dir(shape)
        for engine_name in args.engines.split(","):
            for batch in [int(b) for b in args.batches.split(",")]:
                try:
                    row = run_case(
                        engine_name,
                        model_dir,
                        batch,
                        args.seq,
                        args.steps,
                        args.warmup,
                        device,
                        precision,
                    )
                except Exception as error:  # report and go on: one failing engine ≠ no table
                    row = {"engine": engine_name, "batch": batch, "error": repr(error)[:300]}
                row["shape"] = shape
                rows.append(row)
                print(json.dumps(row), flush=True)
    device_name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    summary = {
        "device": device_name,
        "torch": torch.__version__,
        "matmul_bf16_tflops": measured,
        "shapes": {shape: SHAPES[shape] for shape in shapes},
        "rows": rows,
    }
    if args.output:
        Path(args.output).write_text(json.dumps(summary, indent=2))
    print(
        f"\n{device_name}, torch {torch.__version__}, seq {args.seq}, bf16 unless +fp32; "
        f"measured dense bf16 matmul {measured:.0f} TFLOP/s (datasheet {DATASHEET_BF16_TFLOPS:.0f})"
    )
    print(
        f"{'shape':7} {'engine':12} {'batch':>6} {'step ms':>8} {'sent/s':>9} {'TFLOP/s':>8} "
        f"{'MFU(meas)':>9} {'MFU(sheet)':>10} {'peak GiB':>8}"
    )
    for row in rows:
        if "error" in row:
            label = f"{row['shape']:7} {row['engine']:12} {row['batch']:>6}"
            print(f"{label} error: {row['error'][:80]}")
            continue
        peak = f"{row['peak_gib']:.1f}" if row["peak_gib"] is not None else "-"
        print(
            f"{row['shape']:7} {row['engine']:12} {row['batch']:>6} {1000 * row['step_s']:>8.1f} "
            f"{row['sentences_per_s']:>9.0f} {row['tflops']:>8.1f} "
            f"{row['tflops'] / measured:>9.1%} {row['tflops'] / DATASHEET_BF16_TFLOPS:>10.1%} "
            f"{peak:>8}"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
