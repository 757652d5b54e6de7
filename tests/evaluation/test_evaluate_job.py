"""jobs/evaluate.py end to end on the default Ray Data path, with a tiny model."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_job():
    spec = importlib.util.spec_from_file_location("evaluate_job", REPO / "jobs" / "evaluate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bad_flags_exit_with_the_key(tmp_path, capsys):
    job = load_job()
    with pytest.raises(SystemExit) as exit_info:
        job.main([str(tmp_path), "--tasks", "sts,nonsense"])
    assert exit_info.value.code == 2
    assert "tasks: unknown task 'nonsense'" in capsys.readouterr().err


@pytest.mark.ray
def test_evaluate_job_with_ray_writes_table_and_json(tiny_bert_path, ray_local, tmp_path, capsys):
    job = load_job()
    output = tmp_path / "results.json"
    # Default --senteval-data: the shipped STS-B-only directory.
    code = job.main(
        [
            tiny_bert_path,
            "--pooler",
            "mean",
            "--tasks",
            "STSBenchmark,retrieval",
            "--batch-size",
            "64",
            "--max-seq-len",
            "32",
            "--output",
            str(output),
            "encode.num_cpus_per_actor=0.5",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "STS-B" in printed and "Retrieval STSBenchmark-retrieval" in printed
    saved = json.loads(output.read_text())
    assert saved["config"]["encode"]["use_ray"] is True
    assert saved["config"]["encode"]["max_seq_length"] == 32
    assert saved["sts"]["STSBenchmark"]["n"] == 1379
    assert -100 <= saved["sts"]["STSBenchmark"]["spearman"] <= 100
    assert saved["wall_time_s"]["sts"]["encode_s"] > 0
