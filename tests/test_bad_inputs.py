"""Every bad input in tests/fixtures/bad_inputs/ is refused by its config entry point, before Ray
starts, with a message that names the key or the file.

Fast: no Ray, no model loading. `{F}` in an override or argument is the fixtures directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness.jobs import run

from distributed_emb.checks import ConfigError
from distributed_emb.config import TrainingConfig, load_config
from distributed_emb.infocse.rounds_config import InfoCSEConfig
from distributed_emb.mcr2.compression_config import MCR2Config
from distributed_emb.tune.search_config import SearchJobConfig

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "bad_inputs"

CONFIGS = {
    "training": TrainingConfig,
    "mcr2": MCR2Config,
    "infocse": InfoCSEConfig,
    "tune": SearchJobConfig,
}

# (entry point, YAML fixture or None, overrides / job arguments, text the message must hold)
CASES = [
    # TrainingConfig
    ("training", "train_max_grad_norm_negative.yaml", [], "train.max_grad_norm: must be > 0"),
    ("training", "train_max_grad_norm_zero.yaml", [], "train.max_grad_norm: must be > 0"),
    ("training", "train_learning_rate_inf.yaml", [], "train.learning_rate: must be a finite"),
    ("training", "loss_temperature_nan.yaml", [], "loss.temperature: must be a finite"),
    ("training", "train_torch_threads_zero.yaml", [], "train.torch_threads: must be >= 1"),
    ("training", "train_report_steps_zero.yaml", [], "train.report_steps: must be >= 1"),
    ("training", "data_max_rows_zero.yaml", [], "data.max_rows: must be >= 1 or null, got 0"),
    ("training", "eval_batch_size_zero.yaml", [], "eval.batch_size: must be >= 1, got 0"),
    ("training", "output_checkpoints_to_keep_zero.yaml", [], "output.checkpoints_to_keep"),
    ("training", "ray_num_cpus_zero.yaml", [], "ray.num_cpus: must be >= 1 or null, got 0"),
    ("training", "ray_object_store_in_bytes.yaml", [], "ray.object_store_memory_mb: must be"),
    ("training", "output_dir_unquoted_number.yaml", [], "output.dir: expected a string, got 2024"),
    ("training", "not_yaml.yaml", [], "not_yaml.yaml: not valid YAML"),
    ("training", "top_level_list.yaml", [], "top_level_list.yaml: top level must be a mapping"),
    ("training", "unknown_key.yaml", [], "unknown config key 'train.learning_rte'"),
    ("training", "no_such_file.yaml", [], "config file"),
    ("training", None, ["model.path={F}/corpus.txt"], "corpus.txt is a file, not a model"),
    ("training", None, ["model.path={F}/not_a_model"], "not_a_model is not a model directory"),
    ("training", None, ["data.path={F}/no_such_corpus.txt"], "data.path: "),
    ("training", None, ["train.learning_rate=.nan"], "train.learning_rate: must be a finite"),
    ("training", None, ["train.max_grad_norm=-1"], "train.max_grad_norm: must be > 0 or null"),
    # MCR²
    ("mcr2", "mcr2_head_dropout.yaml", [], "head.dropout: must be in [0, 1), got 1.5"),
    ("mcr2", "mcr2_loss_eps_inf.yaml", [], "loss.eps: must be a finite number"),
    ("mcr2", "mcr2_encoder_batch_size_zero.yaml", [], "model.batch_size: must be >= 1"),
    ("mcr2", None, ["encoder.path={F}/corpus.txt"], "model.path: "),
    ("mcr2", None, ["model.path={F}/corpus.txt"], "model.path: "),
    ("mcr2", None, ["sentences.paths=[{F}/missing.jsonl]"], "sentences.paths: "),
    ("mcr2", "ray_num_cpus_zero.yaml", [], "ray.num_cpus"),
    # InfoCSE
    ("infocse", "infocse_missing_documents.yaml", [], "documents.paths: no/such/documents.jsonl"),
    ("infocse", "infocse_training_max_grad_norm.yaml", [], "train.max_grad_norm: must be"),
    ("infocse", "infocse_rounds_retrieval_threshold.yaml", [], "rounds.retrieval_threshold"),
    ("infocse", None, ["training.model.path={F}/not_a_model"], "model.path: "),
    ("infocse", None, ["model.path={F}/not_a_model"], "model.path: "),
    # Tune settings
    ("tune", "tune_reduction_factor_one.yaml", [], "tune.reduction_factor: must be > 1"),
    ("tune", "tune_grace_period_zero.yaml", [], "tune.grace_period: must be >= 1 or null"),
    ("tune", "tune_seed_negative.yaml", [], "tune.seed: must be in [0, 4294967295] or null"),
    ("tune", "train_max_grad_norm_negative.yaml", [], "train.max_grad_norm"),
    # jobs/evaluate.py
    ("evaluate", None, ["{F}/corpus.txt"], "corpus.txt is not a model directory"),
    ("evaluate", None, ["{F}/not_a_model"], "not_a_model is not a model directory"),
    ("evaluate", None, ["--senteval-data", "{F}/senteval_empty"], "no data for any requested"),
    ("evaluate", None, ["--senteval-data", "{F}/senteval_incomplete"], "MR/rt-polarity.neg"),
    ("evaluate", None, ["--batch-size", "0"], "encode.batch_size"),
]


def _fill(items: list[str]) -> list[str]:
    return [item.replace("{F}", str(FIXTURES)) for item in items]


@pytest.mark.parametrize(
    "entry, yaml_name, arguments, expected",
    CASES,
    ids=[f"{c[0]}-{c[1] or ' '.join(c[2])}".replace(str(FIXTURES), "F") for c in CASES],
)
def test_bad_input_is_refused_with_its_key(entry, yaml_name, arguments, expected, capsys):
    arguments = _fill(arguments)
    if entry == "evaluate":
        assert run("evaluate", [*arguments, "--tasks", "sts,transfer", "--no-ray"]) == 2
        message = capsys.readouterr().err
        assert message.startswith("config error: ")
    else:
        yaml_path = str(FIXTURES / yaml_name) if yaml_name else None
        with pytest.raises(ConfigError) as error_info:
            load_config(CONFIGS[entry], yaml_path, arguments)
        message = str(error_info.value)
    assert expected in message, message


def test_every_fixture_is_used():
    used = {c[1] for c in CASES} | {
        Path(a).name for c in CASES for a in _fill(c[2]) if a.startswith(str(FIXTURES))
    }
    present = {p.name for p in FIXTURES.iterdir() if p.name != "README.md"}
    assert present <= used, f"fixtures no case uses: {sorted(present - used)}"
