"""bench/gpu_check.py cannot rot before a GPU is lent: its CPU smoke run gives every row."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


# Not the compiled arm: it is one line, `encoder.compile_backbone()`, what train.compile=true
# runs, and tests/train/test_compiled_encoder.py compiles the tiny BERT and checks it against the
# eager one. Compiling it a second time here, for a training step, cost 24 s of a cold run
# (31 core-seconds); "ddp+fp32" keeps an engine variant in the smoke run.
@pytest.mark.slow  # a process of its own that builds two engines (about 7 s)
def test_tiny_cpu_run_measures_every_engine(tmp_path):
    output = tmp_path / "gpu_check.json"
    subprocess.run(
        [sys.executable, "-m", "bench.gpu_check", "--tiny", "--device", "cpu", "--batches", "4",
         "--engines", "ddp,ddp+fp32", "--steps", "1", "--warmup", "1",
         "--output", str(output)],
        cwd=REPO, check=True, timeout=600,
    )  # fmt: skip
    rows = {row["engine"]: row for row in json.loads(output.read_text())["rows"]}
    assert set(rows) == {"ddp", "ddp+fp32"}
    for row in rows.values():
        assert "error" not in row, row
        assert row["batch"] == 4 and row["step_s"] > 0 and row["sentences_per_s"] > 0
