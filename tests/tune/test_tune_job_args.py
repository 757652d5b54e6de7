"""jobs/tune_informin.py refuses bad invocations with exit status 2 and a message naming the
problem, before any Ray work."""

from __future__ import annotations

import pytest
from harness.jobs import checked_config, run


@pytest.fixture
def job():
    return "tune_informin"


def refused(job, argv, capsys) -> str:
    """The job's exit status is 2 before any Ray work; what it printed."""
    assert run(job, argv) == 2
    return capsys.readouterr().err


def test_defaults_and_flags_reach_the_config(job, tmp_path):
    config = checked_config(job, ["--num-samples", "6", "--output", str(tmp_path / "s")])
    assert not config.tune.resume and config.tune.num_samples == 6
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
