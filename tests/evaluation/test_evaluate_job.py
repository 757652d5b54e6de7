"""jobs/evaluate.py end to end, through a Ray Data actor pool and in this process (the default
on one machine), with a tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness.jobs import checked_config, run


def test_bad_flags_exit_with_the_key(tmp_path, capsys):
    assert run("evaluate", [str(tmp_path), "--tasks", "sts,nonsense"]) == 2
    assert "tasks: unknown task 'nonsense'" in capsys.readouterr().err


@pytest.mark.ray
def test_evaluate_job_with_ray_writes_table_and_json(tiny_bert_path, ray_local, tmp_path, capsys):
    output = tmp_path / "results.json"
    # Default --senteval-data: the shipped STS-B-only directory.
    code = run(
        "evaluate",
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
            "encode.use_ray=true",
            "encode.num_cpus_per_actor=0.5",
        ],
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


def test_evaluate_job_on_one_machine_encodes_in_process(tiny_bert_path, tmp_path, monkeypatch):
    """No cluster to join, one actor: encoding in this process; Ray is neither started nor used."""
    from distributed_emb import cli
    from distributed_emb.model import embedder

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(cli, "start_ray", lambda *a, **k: pytest.fail("the job started Ray"))
    monkeypatch.setattr(embedder, "ray_encode", lambda *a, **k: pytest.fail("encoded on Ray"))
    output = tmp_path / "results.json"
    argv = [tiny_bert_path, "--pooler", "mean", "--tasks", "STSBenchmark", "--output", str(output)]
    assert run("evaluate", [*argv, "--max-seq-len", "32"]) == 0
    saved = json.loads(output.read_text())
    assert saved["config"]["encode"]["use_ray"] == "auto"
    assert saved["sts"]["STSBenchmark"]["n"] == 1379


def _stsb_only(root: Path) -> Path:
    """A SentEval-shaped tree root/data/downstream holding STS-B test only (the shipped copy)."""
    from distributed_emb.paths import shipped_senteval_dir

    downstream = root / "data" / "downstream"
    target = downstream / "STS" / "STSBenchmark"
    target.mkdir(parents=True)
    source = Path(shipped_senteval_dir()) / "STS" / "STSBenchmark" / "sts-test.csv"
    (target / "sts-test.csv").write_bytes(source.read_bytes())
    return downstream


@pytest.mark.parametrize("level", ["downstream", "data", "checkout"])
def test_senteval_data_finds_downstream_under_data_or_a_checkout(tmp_path, level):
    downstream = _stsb_only(tmp_path)
    given = {"downstream": downstream, "data": downstream.parent, "checkout": tmp_path}[level]
    config = checked_config("evaluate", ["--senteval-data", str(given), "--tasks", "STSBenchmark"])
    assert Path(config.eval.senteval_dir) == downstream


def test_no_data_for_any_requested_task_exits_2_naming_the_layout(tmp_path, capsys):
    downstream = _stsb_only(tmp_path)
    output = tmp_path / "results.json"
    code = run(
        "evaluate",
        ["--senteval-data", str(downstream.parent), "--tasks", "transfer", "--no-ray",
         "--output", str(output)],
    )  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "eval.senteval_dir: no data for any requested task (MR, CR, SUBJ" in err
    assert "data/downstream directory (or its parent data/)" in err
    assert "STS/STSBenchmark/sts-test.csv" in err
    assert not output.exists()  # refused before any work: no empty results file


def test_some_requested_tasks_present_is_not_an_error(tmp_path):
    downstream = _stsb_only(tmp_path)
    config = checked_config("evaluate", ["--senteval-data", str(downstream), "--tasks", "sts"])
    assert config.eval.senteval_dir == str(downstream)  # STS12–16 and SICK are skipped later


def test_evaluate_job_without_ray_reads_senteval_data_given_as_data_dir(
    tiny_bert_path, tmp_path, capsys
):
    downstream = _stsb_only(tmp_path / "SentEval")
    output = tmp_path / "results.json"
    code = run(
        "evaluate",
        [tiny_bert_path, "--senteval-data", str(downstream.parent), "--tasks", "STSBenchmark",
         "--pooler", "mean", "--max-seq-len", "32", "--no-ray", "--output", str(output)]
    )  # fmt: skip
    assert code == 0
    saved = json.loads(output.read_text())
    assert Path(saved["senteval_dir"]) == downstream
    assert saved["sts"]["STSBenchmark"]["n"] == 1379
    assert saved["skipped"] == []
