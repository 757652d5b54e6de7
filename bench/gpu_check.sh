#!/usr/bin/env bash
# One command for a lent GPU: DDP, DDP with the encoder compiled (train.compile=true) and
# DeepSpeed ZeRO-2, BERT-base-sized random encoder, bf16, seq 32, per-GPU batch 128 and 512.
# Ends in under 9 minutes (compiling is in the warm-up steps); prints the table last.
# Missing Python packages (deepspeed and its pure-Python needs) may be carried as wheels in
# .whl/ (see docs/BENCHMARKS.md); they are installed to /tmp/site first.
set -uo pipefail
cd "$(dirname "$0")/.."
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
out="${OUT:-/tmp}/gpu_check.json"
timeout 530 python3 bench/gpu_check.py --device cuda --batches 128,512 --engines ddp,ddp+compile,zero2 \
  --steps 20 --warmup 5 --output "$out"
