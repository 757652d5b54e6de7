"""Run identity: a run name that already holds a run with other settings is refused before any
training, naming the keys that differ; output directories with results are not reused
silently; InfoCSE rounds never share a Ray Train run.

The earlier runs here are checkpoint directories written by checkpointing.save_loop_state
(what every Ray Train worker writes) in Ray Train's layout `<storage>/<run>/checkpoint_<time>`;
`test_a_real_run_is_refused_with_other_settings` checks that layout against a real run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness.jobs import job_module, run
from harness.tiny_run import unread_stream

from distributed_emb.cli import job_config
from distributed_emb.config import TrainingConfig, load_config, to_dict
from distributed_emb.infocse.rounds_config import InfoCSEConfig
from distributed_emb.train import driver
from distributed_emb.train.checkpointing import LoopState, save_loop_state
from distributed_emb.train.run_identity import (
    IDENTITY_FILE,
    RunIdentityError,
    fingerprint,
    prepare_run,
)


class TrainingStarted(Exception):
    """Raised by the stand-in TorchTrainer: the run got past every check."""


@pytest.fixture
def no_training(monkeypatch):
    """run_training up to the TorchTrainer, which is replaced: records the run name it got."""
    started: list[str] = []

    def fake_build_trainer(config, stream, run_name=None, **options):
        started.append(run_name)
        raise TrainingStarted(run_name)

    monkeypatch.setattr(driver, "build_trainer", fake_build_trainer)
    return started


def _config(tmp_path, *overrides, output="out", storage="storage", run_name="r1"):
    base = [f"output.dir={tmp_path / output}", "train.max_steps=2"]
    if storage is not None:
        base.append(f"output.storage_path={tmp_path / storage}")
    if run_name is not None:
        base.append(f"output.run_name={run_name}")
    return load_config(TrainingConfig, None, [*base, *overrides])


def _earlier_run(config: TrainingConfig, run_dir, checkpoints=("2026-01-01_10-00-00.000000",)):
    """What Ray Train leaves in storage after a run reported checkpoints."""
    for stamp in checkpoints:
        save_loop_state(str(run_dir / f"checkpoint_{stamp}"), LoopState(step=2), to_dict(config), 0)


def _run(config, stream=None):
    return driver.run_training(config, stream=stream or unread_stream())


def test_other_settings_under_the_same_run_name_are_refused_before_training(tmp_path, no_training):
    _earlier_run(_config(tmp_path, "train.learning_rate=1e-5"), tmp_path / "storage" / "r1")
    changed = _config(tmp_path, "train.learning_rate=3e-5", "loss.temperature=0.1")

    with pytest.raises(RunIdentityError) as refused:
        _run(changed)

    message = str(refused.value)
    assert message.startswith("output.run_name=r1 already holds a run with different settings")
    assert "loss.temperature 0.05 → 0.1, train.learning_rate 1e-05 → 3e-05;" in message
    assert "--resume-anyway" in message and "choose another output.run_name" in message
    assert str(tmp_path / "storage" / "r1") in message
    assert no_training == []


def test_the_newest_checkpoint_decides(tmp_path, no_training):
    # Resumed "anyway" with a new learning rate: the later checkpoints carry the new settings.
    run_dir = tmp_path / "storage" / "r1"
    _earlier_run(_config(tmp_path, "train.learning_rate=1e-5"), run_dir)
    _earlier_run(
        _config(tmp_path, "train.learning_rate=3e-5"), run_dir, ["2026-01-01_11-00-00.000000"]
    )
    with pytest.raises(TrainingStarted):
        _run(_config(tmp_path, "train.learning_rate=3e-5"))
    with pytest.raises(RunIdentityError, match="train.learning_rate 3e-05 → 1e-05"):
        _run(_config(tmp_path, "train.learning_rate=1e-5"))


def test_an_interrupted_upload_is_passed_over_for_the_checkpoint_before_it(tmp_path, no_training):
    # A node lost while its checkpoint was uploading leaves a newer directory without the
    # run's files; Ray Train resumes from the one before it, and so does the comparison.
    run_dir = tmp_path / "storage" / "r1"
    _earlier_run(_config(tmp_path), run_dir)
    interrupted = run_dir / "checkpoint_2026-01-01_11-00-00.000000"
    interrupted.mkdir()
    (interrupted / "model.safetensors").write_bytes(b"half")
    with pytest.raises(TrainingStarted):
        _run(_config(tmp_path))
    assert no_training == ["r1"]
    with pytest.raises(RunIdentityError, match="train.seed 42 → 7"):
        _run(_config(tmp_path, "train.seed=7"))


def test_a_checkpoint_of_no_known_run_is_refused_naming_what_it_lacks(tmp_path, no_training):
    (tmp_path / "storage" / "r1" / "checkpoint_2026-01-01_10-00-00.000000").mkdir(parents=True)
    with pytest.raises(RunIdentityError, match="run_identity.json missing from checkpoint_2026"):
        _run(_config(tmp_path))
    assert no_training == []


def test_a_resume_onto_another_stream_is_refused_before_training(tmp_path, no_training):
    """The data settings outside the run identity (the token cache built, rebuilt or removed)
    still decide which rows a position points at: the checkpoint's stream is compared."""
    from distributed_emb.data.epoch_plan import batch_plan
    from distributed_emb.data.training_stream import StreamChangedError

    config = _config(tmp_path)
    stream = unread_stream().identity(batch_plan(config.data, config.train.global_batch))
    save_loop_state(
        str(tmp_path / "storage" / "r1" / "checkpoint_2026-01-01_10-00-00.000000"),
        LoopState(step=2, stream=stream),
        to_dict(config),
        0,
    )
    with pytest.raises(StreamChangedError, match=r"checkpoint .*checkpoint_2026.*rows 'indexed:"):
        _run(_config(tmp_path), unread_stream(shards=(("part-0.arrow", 40), ("part-1.arrow", 24))))
    assert no_training == []
    with pytest.raises(TrainingStarted):  # the same stream: resumed
        _run(_config(tmp_path))


def test_same_settings_resume_whatever_the_ignored_keys_say(tmp_path, no_training):
    _earlier_run(_config(tmp_path), tmp_path / "storage" / "r1")
    same_run = _config(
        tmp_path,
        "ray.num_cpus=3",
        "eval.test_after_training=false",
        "train.max_failures=3",
        "train.report_steps=7",
        output="elsewhere",
    )
    with pytest.raises(TrainingStarted):
        _run(same_run)
    assert no_training == ["r1"]


def test_resume_anyway_continues_with_the_new_settings(tmp_path, no_training):
    _earlier_run(_config(tmp_path, "train.learning_rate=1e-5"), tmp_path / "storage" / "r1")
    with pytest.raises(TrainingStarted):
        _run(_config(tmp_path, "train.learning_rate=3e-5", "output.resume=anyway"))


def test_storage_given_as_a_uri(tmp_path, no_training):
    # s3:// and gs:// are reached through pyarrow.fs.FileSystem.from_uri; file:// takes the same
    # path without a bucket.
    _earlier_run(_config(tmp_path, "train.seed=1"), tmp_path / "storage" / "r1")
    config = _config(tmp_path, "train.seed=2", f"output.storage_path=file://{tmp_path / 'storage'}")
    with pytest.raises(RunIdentityError, match="train.seed 1 → 2") as refused:
        _run(config)
    assert f"file://{tmp_path / 'storage'}/r1" in str(refused.value)


def test_checkpoints_without_an_identity_file_are_compared_through_their_config(tmp_path):
    run_dir = tmp_path / "storage" / "r1"
    _earlier_run(_config(tmp_path, "train.batch_size=16"), run_dir)
    for identity_file in run_dir.glob(f"*/{IDENTITY_FILE}"):
        identity_file.unlink()  # a checkpoint written before run identities existed
    with pytest.raises(RunIdentityError, match="train.global_batch 32 → 64"):
        prepare_run(_config(tmp_path, "train.batch_size=32"))


def test_a_checkpoint_records_the_fingerprint(tmp_path):
    config = _config(tmp_path)
    _earlier_run(config, tmp_path / "run")
    (checkpoint,) = (tmp_path / "run").iterdir()
    record = json.loads((checkpoint / IDENTITY_FILE).read_text())
    assert record["fingerprint"] == fingerprint(to_dict(config))
    assert record["settings"]["train.learning_rate"] == 3e-5
    assert not any(key.startswith(("output.", "ray.")) for key in record["settings"])


def test_fingerprint_covers_the_math_not_the_plumbing(tmp_path):
    base = fingerprint(to_dict(_config(tmp_path)))
    plumbing = _config(
        tmp_path,
        "output.checkpoints_to_keep=5",
        "ray.object_store_memory_mb=2048",
        "train.cpus_per_worker=2",
        "eval.batch_size=64",
        output="other",
        storage="other_storage",
        run_name="r2",
    )
    assert fingerprint(to_dict(plumbing)) == base
    # The same global batch split another way is the same run (a resized elastic group).
    for split in (["train.num_workers=1", "train.batch_size=64"], ["train.num_workers=[1,2]"]):
        assert fingerprint(to_dict(_config(tmp_path, *split))) == base, split
    for math_key in ("train.learning_rate=1e-4", "data.max_rows=10", "model.pooler=cls"):
        assert fingerprint(to_dict(_config(tmp_path, math_key))) != base, math_key


# --- output directories -------------------------------------------------------------------


def _finished_output(tmp_path, output="out"):
    (tmp_path / output / "model").mkdir(parents=True)
    (tmp_path / output / "metrics.json").write_text("{}")


def test_an_output_holding_a_run_is_refused_naming_both_flags(tmp_path, no_training):
    _finished_output(tmp_path)
    with pytest.raises(RunIdentityError) as refused:
        _run(_config(tmp_path, storage=None, run_name=None))
    assert str(refused.value) == (
        f"--output {tmp_path / 'out'} already holds a run (metrics.json, model): pass --resume "
        "to continue it from its last checkpoint, or --overwrite to delete it and start again "
        "(output.resume=must / output.resume=overwrite)"
    )
    assert no_training == []


def test_resume_continues_the_run_in_the_output_directory(tmp_path, no_training):
    config = _config(tmp_path, storage=None, run_name=None)
    _finished_output(tmp_path)
    # With no storage path and no run name, a run lives in <output>/ray_results/train.
    _earlier_run(config, tmp_path / "out" / "ray_results" / "train")
    with pytest.raises(TrainingStarted):
        _run(_config(tmp_path, "output.resume=must", storage=None, run_name=None))
    assert no_training == ["train"]


def test_resume_with_nothing_to_resume_is_refused(tmp_path, no_training):
    with pytest.raises(RunIdentityError, match="no checkpoint of run 'r1' in .*storage/r1"):
        _run(_config(tmp_path, "output.resume=must"))


def test_overwrite_deletes_the_earlier_run_and_starts_again(tmp_path, no_training):
    _finished_output(tmp_path)
    _earlier_run(_config(tmp_path, "train.learning_rate=1e-5"), tmp_path / "storage" / "r1")
    with pytest.raises(TrainingStarted):
        _run(_config(tmp_path, "train.learning_rate=3e-5", "output.resume=overwrite"))
    assert not (tmp_path / "storage" / "r1").exists()
    assert not (tmp_path / "out" / "metrics.json").exists()
    assert not (tmp_path / "out" / "model").exists()


def test_command_line_refuses_before_ray_starts(tmp_path, capsys):
    _finished_output(tmp_path)
    assert run("train_informin", ["--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"error: --output {tmp_path / 'out'} already holds a run" in err
    assert "--resume" in err and "--overwrite" in err


@pytest.mark.parametrize(
    "flag, mode",
    [("--resume", "must"), ("--resume-anyway", "anyway"), ("--overwrite", "overwrite")],
)
def test_command_line_flags_set_output_resume(tmp_path, flag, mode):
    config = job_config(job_module("train_informin").JOB, ["--output", str(tmp_path / "o"), flag])
    assert config.output.resume == mode


# --- InfoCSE rounds ------------------------------------------------------------------------


def test_infocse_rounds_get_their_own_runs(tmp_path, monkeypatch):
    from distributed_emb.infocse import round_training

    names = []
    monkeypatch.setattr(
        round_training, "run_training", lambda config, callbacks=None: names.append(config.output)
    )
    config = InfoCSEConfig()
    config.output.dir = str(tmp_path / "infocse")
    config.output.storage_path = str(tmp_path / "storage")
    for index in (1, 2):
        for stage in ("train", "supervised"):
            out = tmp_path / "infocse" / f"round_{index}" / stage
            name = f"round_{index}-{stage}"
            round_training.train_stage(
                round_training.training_config(config, "model", "p", str(out), name)
            )
    assert [o.run_name for o in names] == [
        "infocse-round_1-train",
        "infocse-round_1-supervised",
        "infocse-round_2-train",
        "infocse-round_2-supervised",
    ]
    # A round started afresh deletes what an earlier attempt of it left; one whose pairs an
    # earlier attempt committed continues its training.
    assert {o.resume for o in names} == {"overwrite"}
    continued = round_training.training_config(config, "model", "p", str(out), "r", resume="auto")
    assert continued.output.resume == "auto"


# --- against a real run --------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.ray
def test_a_real_run_is_refused_with_other_settings(ray_local, tiny_run, tmp_path, tiny_bert_path):
    """Ray Train's own checkpoint layout: the session's finished tiny run, under its
    output.run_name in its storage path, is found from another output directory."""
    from harness.tiny_run import tiny_run_config

    config, _ = tiny_run
    storage = Path(config.output.storage_path) / config.output.run_name
    assert list(storage.glob("checkpoint_*/" + IDENTITY_FILE))

    # The output directory is not what finds the run: this one is new.
    other = tiny_run_config(
        tiny_bert_path,
        Path(config.output.dir).parent,
        f"output.dir={tmp_path / 'out'}",
        "train.learning_rate=3e-5",
    )
    with pytest.raises(RunIdentityError, match="train.learning_rate 0.0001 → 3e-05"):
        driver.run_training(other)
