#!/usr/bin/env bash
# One command for a lent GPU: DDP in bf16 and fp32, DDP with the encoder compiled
# (train.compile=true) and DeepSpeed ZeRO-2 on a BERT-base-sized random encoder; DDP bf16 and
# fp32 on one of the default encoder's shape (MiniLM-L6); seq 32, per-GPU batch 128 and 512.
# Ends in under 7 minutes (compiling is in the warm-up steps); prints each table last.
# Missing Python packages (deepspeed and its pure-Python needs) may be carried as wheels in
# .whl/ (see docs/BENCHMARKS.md); they are installed to /tmp/site first.
set -uo pipefail
cd "$(dirname "$0")/.."
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the package, uninstalled
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
out="${OUT:-/tmp}"
timeout 300 python3 -m bench.gpu_check --device cuda --shapes base --batches 128,512 \
  --engines ddp,ddp+fp32,ddp+compile,zero2 --steps 20 --warmup 5 --output "$out/gpu_check_base.json"
timeout 100 python3 -m bench.gpu_check --device cuda --shapes minilm --batches 128,512 \
  --engines ddp,ddp+fp32 --steps 20 --warmup 5 --output "$out/gpu_check_minilm.json"
