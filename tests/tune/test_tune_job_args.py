"""jobs/tune_informin.py refuses bad invocations with exit status 2 and a message naming the
problem, before any Ray work."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def job():
    spec = importlib.util.spec_from_file_location(
        "tune_job_args", REPO / "jobs" / "tune_informin.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def refused(job, argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        job.parse_args(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_defaults_and_flags_reach_the_config(job, tmp_path):
    config, resume = job.parse_args(["--num-samples", "6", "--output", str(tmp_path / "s")])
    assert not resume and config.tune.num_samples == 6
    assert config.output.dir == str(tmp_path / "s") and config.model.path is None


def test_bad_values_are_refused_naming_the_key(job, capsys, tmp_path):
    err = refused(job, ["--output", str(tmp_path), "tune.reduction_factor=0.5"], capsys)
    assert "tune.reduction_factor: must be > 1" in err
    err = refused(
        job, ["--output", str(tmp_path), "search.loss.tau={type: choice, values: [1]}"], capsys
    )
    assert "search.loss.tau" in err


def test_resume_needs_an_output_with_a_saved_search_and_nothing_else(job, capsys, tmp_path):
    assert "--resume needs --output" in refused(job, ["--resume"], capsys)
    assert "does not exist" in refused(job, ["--resume", "--output", str(tmp_path)], capsys)
    err = refused(job, ["--resume", "--output", str(tmp_path), "--num-samples", "3"], capsys)
    assert "drop --config, --num-samples" in err


def test_a_directory_holding_a_search_is_not_overwritten(job, capsys, tmp_path):
    (tmp_path / "search").mkdir()
    (tmp_path / "search" / "tuner.pkl").write_bytes(b"")  # what Tune writes first
    err = refused(job, ["--output", str(tmp_path)], capsys)
    assert "already holds a search: add --resume" in err
