import pytest

from distributed_emb.config import ConfigError, TrainingConfig, load_config, parse_override


def test_yaml_and_overrides_merge(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("loss:\n  temperature: 0.1\ntrain:\n  batch_size: 16\n")
    config = load_config(TrainingConfig, str(path), ["loss.reconstruction_weight=0.4"])
    assert config.loss.temperature == 0.1
    assert config.loss.reconstruction_weight == 0.4
    assert config.train.batch_size == 16
    assert config.train.num_workers == 2  # untouched default


def test_shipped_configs_load():
    for name in ("informin_default.yaml",):
        load_config(TrainingConfig, f"jobs/configs/{name}", [])


@pytest.mark.parametrize(
    "override, key",
    [
        ("loss.temperature=0", "loss.temperature"),
        ("loss.temperature=-0.5", "loss.temperature"),
        ("loss.reconstruction_weight=-1", "loss.reconstruction_weight"),
        ("train.batch_size=1", "train.batch_size"),
        ("train.batch_size=abc", "train.batch_size"),
        ("train.batch_size=2.5", "train.batch_size"),
        ("train.batchsize=8", "train.batchsize"),
        ("nonsense.key=1", "nonsense"),
        ("model.path=/definitely/missing/model", "model.path"),
        ("model.pooler=max", "model.pooler"),
        ("train.use_gpu=yes please", "train.use_gpu"),
        ("train.mini_batch_size=64", "train.mini_batch_size"),
        ("train.precision=fp16", "train.precision"),
        ("data.path=/no/such/corpus.txt", "data.path"),
    ],
)
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(TrainingConfig, None, [override])


def test_unknown_key_in_yaml_named_with_its_section(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  learning_rte: 0.1\n")
    with pytest.raises(ConfigError, match=r"train\.learning_rte"):
        load_config(TrainingConfig, str(path), [])


def test_missing_config_file_is_named():
    with pytest.raises(ConfigError, match="nope.yaml"):
        load_config(TrainingConfig, "nope.yaml", [])


def test_override_values_are_yaml_typed():
    assert parse_override("a.b=3") == ("a.b", 3)
    assert parse_override("a.b=3.0e-5") == ("a.b", 3e-5)
    assert parse_override("a.b=null") == ("a.b", None)
    with pytest.raises(ConfigError):
        parse_override("no_equals_sign")


def test_exponent_without_dot_is_a_number(tmp_path):
    # YAML 1.1 reads 3e-5 as a string; users write it that way all the time.
    config = load_config(TrainingConfig, None, ["train.learning_rate=3e-5"])
    assert config.train.learning_rate == 3e-5
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  learning_rate: 2e-5\n")
    assert load_config(TrainingConfig, str(path), []).train.learning_rate == 2e-5


def test_int_is_accepted_for_float_but_not_bool_for_int():
    config = load_config(TrainingConfig, None, ["loss.temperature=1"])
    assert config.loss.temperature == 1.0 and isinstance(config.loss.temperature, float)
    with pytest.raises(ConfigError, match="train.num_workers"):
        load_config(TrainingConfig, None, ["train.num_workers=true"])


def test_job_rejects_bad_config_before_ray_starts(tmp_path):
    import subprocess
    import sys

    completed = subprocess.run(
        [sys.executable, "jobs/train_informin.py", "loss.temperature=0", "--output", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 2
    assert "loss.temperature" in completed.stderr
    assert "ray" not in completed.stderr.lower().split("config error")[0][-200:]
