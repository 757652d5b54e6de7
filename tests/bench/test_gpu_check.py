"""bench/gpu_check.py cannot rot before a GPU is lent: its CPU smoke run gives every row."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # the compiled arm compiles a tiny BERT (about a minute on 2 cores)
def test_tiny_cpu_run_measures_every_engine(cpp_compiler, tmp_path):
    output = tmp_path / "gpu_check.json"
    subprocess.run(
        [sys.executable, "-m", "bench.gpu_check", "--tiny", "--device", "cpu", "--batches", "4",
         "--engines", "ddp,ddp+compile", "--steps", "1", "--warmup", "1",
         "--output", str(output)],
        cwd=REPO, check=True, timeout=600,
    )  # fmt: skip
    rows = {row["engine"]: row for row in json.loads(output.read_text())["rows"]}
    assert set(rows) == {"ddp", "ddp+compile"}
    for row in rows.values():
        assert "error" not in row, row
        assert row["batch"] == 4 and row["step_s"] > 0 and row["sentences_per_s"] > 0
