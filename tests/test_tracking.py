"""Watching a run: metrics sinks, the quiet console, plots, and the CLI's config listing."""

import json
import logging
import sys

import pytest

from distributed_emb import console, tracking
from distributed_emb.checks import ConfigError
from distributed_emb.config import TrainingConfig, load_config
from distributed_emb.console import (
    REPEATING_RAY_LOGGERS,
    RepeatFilter,
    dedupe_repeated_ray_warnings,
)
from distributed_emb.plots import PLOT_FILE, plot_learning_curves, write_run_plots
from distributed_emb.tracking import MetricsSinks, read_train_log

CLEANER_WARNING = (
    "Failed to query Ray Train Controller actor state. "
    "State API may be temporarily unavailable. Continuing to monitor."
)


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _logger_with(name, *filters):
    logger = logging.getLogger(name)
    logger.propagate = False
    logger.handlers = []
    logger.filters = []
    for f in filters:
        logger.addFilter(f)
    handler = _Collect()
    logger.addHandler(handler)
    return logger, handler


# ---------------------------------------------------------------------------------------------
# Quiet console
# ---------------------------------------------------------------------------------------------


def test_repeated_warning_is_said_once_then_counted():
    logger, seen = _logger_with("test.tracking.repeat", RepeatFilter())
    for _ in range(1000):
        logger.warning(CLEANER_WARNING)
    logger.warning("something else")
    assert seen.lines[0] == CLEANER_WARNING
    assert [line.split("[")[-1] for line in seen.lines[1:4]] == [
        "said 10 times so far; repeats are counted, not shown]",
        "said 100 times so far; repeats are counted, not shown]",
        "said 1000 times so far; repeats are counted, not shown]",
    ]
    assert seen.lines[4:] == ["something else"]  # other messages are not held back


def test_messages_with_arguments_are_told_apart_by_their_text():
    logger, seen = _logger_with("test.tracking.args", RepeatFilter())
    for step in (1, 2, 2, 3):
        logger.warning("step %d", step)
    assert seen.lines == ["step 1", "step 2", "step 3"]


def test_the_ray_cleaner_logger_gets_one_filter():
    for name in REPEATING_RAY_LOGGERS:
        logging.getLogger(name).filters = []
    dedupe_repeated_ray_warnings()
    dedupe_repeated_ray_warnings()  # idempotent: a second call adds nothing
    (name,) = REPEATING_RAY_LOGGERS
    filters = logging.getLogger(name).filters
    assert len(filters) == 1 and isinstance(filters[0], RepeatFilter)
    # The name is the module that logs the warning in this Ray version.
    from ray.train.v2._internal.execution.controller import placement_group_cleaner

    assert placement_group_cleaner.logger.name == name


def test_worker_setup_turns_ray_data_progress_bars_off():
    from ray.data import DataContext

    context = DataContext.get_current()
    before = (context.enable_progress_bars, context.enable_operator_progress_bars)
    try:
        console.quiet_worker_setup()
        assert not context.enable_progress_bars
        assert not context.enable_operator_progress_bars
    finally:
        context.enable_progress_bars, context.enable_operator_progress_bars = before


def test_start_ray_sets_the_worker_setup_hook(monkeypatch):
    import ray

    from distributed_emb import runtime

    captured = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: captured.update(kwargs))
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    runtime.start_ray(load_config(TrainingConfig, None, []).ray)
    hook = captured["runtime_env"]["worker_process_setup_hook"]
    module, _, function = hook.rpartition(".")
    assert getattr(sys.modules[module], function) is console.quiet_worker_setup
    # The joined cluster's address reaches every worker: Ray Train's placement-group cleaner
    # would otherwise ask whichever Ray instance the machine started last.
    assert captured["address"] == "127.0.0.1:1"
    assert captured["runtime_env"]["env_vars"]["RAY_ADDRESS"] == "127.0.0.1:1"


def test_a_job_that_sets_ray_address_itself_is_not_given_it_twice(monkeypatch):
    # Ray refuses a driver runtime env that sets again a variable the job's runtime env sets.
    import ray

    from distributed_emb import runtime

    captured = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: captured.update(kwargs))
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    job = {"runtime_env": {"env_vars": {"RAY_ADDRESS": "127.0.0.1:1"}}}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(job))
    runtime.start_ray(load_config(TrainingConfig, None, []).ray)
    assert "RAY_ADDRESS" not in captured["runtime_env"]["env_vars"]


# ---------------------------------------------------------------------------------------------
# Metrics sinks
# ---------------------------------------------------------------------------------------------


def _config(*overrides):
    return load_config(TrainingConfig, None, list(overrides))


def test_jsonl_and_tensorboard_sinks_write_every_logged_step(tmp_path):
    sinks = MetricsSinks.open(_config(), tmp_path)
    assert [s.name for s in sinks.sinks] == ["train_log.jsonl", "tensorboard"]
    sinks.log(10, {"loss": 1.5, "loss_reconstruction": 2e-5, "lr": 1e-5, "final": True})
    sinks.log(10, {"stsb_dev_spearman": 80.0, "step": 10}, "eval")
    sinks.close()
    rows = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert rows[0]["kind"] == "train" and rows[0]["step"] == 10
    assert rows[0]["loss_reconstruction"] == 2e-5 and "final" not in rows[0]  # numbers only
    assert rows[1]["kind"] == "eval" and rows[1]["stsb_dev_spearman"] == 80.0
    assert type(rows[1]["step"]) is int  # the row's step, not a metric turned float
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    accumulator_module = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator"
    )
    accumulator = accumulator_module.EventAccumulator(str(tmp_path / "tensorboard"))
    accumulator.Reload()
    assert "train/loss" in accumulator.Tags()["scalars"]
    assert accumulator.Scalars("eval/stsb_dev_spearman")[0].value == pytest.approx(80.0)


def test_tensorboard_can_be_turned_off(tmp_path):
    sinks = MetricsSinks.open(_config("logging.tensorboard=false"), tmp_path)
    assert [s.name for s in sinks.sinks] == ["train_log.jsonl"]
    assert not (tmp_path / "tensorboard").exists()


def test_a_missing_tracker_package_is_one_line_not_a_crash(tmp_path, monkeypatch, caplog):
    real_find_spec = tracking.importlib.util.find_spec
    monkeypatch.setattr(
        tracking.importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("wandb", "mlflow") else real_find_spec(name, *a),
    )
    with caplog.at_level(logging.WARNING, logger="distributed_emb.tracking"):
        sinks = MetricsSinks.open(
            _config("logging.wandb=true", "logging.mlflow=true", "logging.tensorboard=false"),
            tmp_path,
        )
    assert [s.name for s in sinks.sinks] == ["train_log.jsonl"]
    assert caplog.messages == [
        "logging.wandb: wandb is not installed (pip install wandb); training goes on without it",
        "logging.mlflow: mlflow is not installed (pip install mlflow); training goes on without it",
    ]


def test_a_tracker_that_cannot_start_or_fails_later_is_dropped(tmp_path, monkeypatch, caplog):
    class Broken:
        name = "broken"

        def log(self, step, metrics, kind):
            raise ConnectionError("server went away")

        def close(self):
            pass

    def no_server(*args, **kwargs):
        raise ConnectionError("cannot reach the tracking server\n(retried 3 times)")

    monkeypatch.setattr(tracking, "TensorBoardSink", no_server)
    with caplog.at_level(logging.WARNING, logger="distributed_emb.tracking"):
        sinks = MetricsSinks.open(_config(), tmp_path)
        assert caplog.messages == [
            "logging.tensorboard: could not start (ConnectionError: cannot reach the tracking "
            "server (retried 3 times)); training goes on without it"
        ]
        sinks.sinks.append(Broken())
        sinks.log(1, {"loss": 1.0})
        sinks.log(2, {"loss": 0.5})
    assert [s.name for s in sinks.sinks] == ["train_log.jsonl"]  # the others go on
    assert caplog.messages[1:] == [
        "broken stopped logging (dropped for this run): server went away"
    ]
    assert [r["step"] for r in read_train_log(tmp_path / "train_log.jsonl")] == [1, 2]


def test_logging_steps_must_be_positive():
    with pytest.raises(ConfigError, match=r"logging\.logging_steps: must be >= 1, got 0"):
        _config("logging.logging_steps=0")


def test_read_train_log_keeps_the_last_row_of_a_repeated_step_and_skips_a_torn_line(tmp_path):
    path = tmp_path / "train_log.jsonl"
    path.write_text(
        '{"kind": "train", "step": 10, "loss": 2.0}\n'
        '{"kind": "eval", "step": 10, "stsb_dev_spearman": 70.0}\n'
        '{"kind": "train", "step": 10, "loss": 1.0}\n'  # a resumed run redid step 10
        '{"kind": "train", "step": 20, "lo'  # killed mid-write
    )
    rows = read_train_log(path)
    assert [(r["kind"], r["step"]) for r in rows] == [("eval", 10), ("train", 10)]
    assert rows[1]["loss"] == 1.0


# ---------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------

HISTORY = [
    {"step": 0, "stsb_dev_spearman": 80.0},
    {"step": 10, "stsb_dev_spearman": 81.0, "loss": 1.0, "sentences_per_s": 50.0, "lr": 1e-5},
    {"step": 20, "stsb_dev_spearman": 82.0, "loss": 0.8, "sentences_per_s": 55.0, "lr": 5e-6},
]


def test_learning_curves_are_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [
        {"kind": "train", "step": s, "loss": 1 / s, "loss_reconstruction": 1e-5, "lr": 1e-5}
        for s in range(1, 21)
    ]
    path = plot_learning_curves(HISTORY, tmp_path / "curves.png", rows)
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_run_plots_come_from_history_and_train_log(tmp_path):
    pytest.importorskip("matplotlib")
    log_path = tmp_path / "train_log.jsonl"
    log_path.write_text('{"kind": "train", "step": 5, "loss": 1.2, "lr": 1e-5}\n')
    assert write_run_plots(tmp_path, HISTORY, log_path) == str(tmp_path / PLOT_FILE)
    assert (tmp_path / PLOT_FILE).stat().st_size > 0
    assert write_run_plots(tmp_path / "b", HISTORY, None)  # no train log: history alone


def test_run_plots_without_matplotlib_are_one_line(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib → ImportError
    with caplog.at_level(logging.WARNING, logger="distributed_emb.tracking"):
        assert write_run_plots(tmp_path, HISTORY, None) is None
    assert caplog.messages == [
        f"no {PLOT_FILE}: plots need matplotlib: pip install matplotlib "
        "(or pip install -e '.[tune]')"
    ]
    assert not (tmp_path / PLOT_FILE).exists()


# ---------------------------------------------------------------------------------------------
# The CLI: --print-config and the key listing in --help
# ---------------------------------------------------------------------------------------------


def test_print_config_prints_the_resolved_yaml_and_exits_0(tmp_path, capsys):
    import dataclasses

    import yaml
    from harness.jobs import job_module

    from distributed_emb.cli import run_job

    default = tmp_path / "default.yaml"
    default.write_text("train:\n  learning_rate: 1.0e-5\n")
    job = dataclasses.replace(job_module("train_informin").JOB, default_config=default)
    out = tmp_path / "run"
    assert run_job(job, ["--print-config", "--output", str(out), "loss.temperature=0.1"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["train"]["learning_rate"] == 1e-5  # the file
    assert printed["loss"]["temperature"] == 0.1  # the override
    assert printed["train"]["batch_size"] == 32  # a built-in default
    assert printed["output"]["dir"] == str(out)
    assert load_config(TrainingConfig, None, []).logging.logging_steps == 10
    assert not out.exists()  # printing the config starts nothing and writes nothing


def test_output_dir_is_made_absolute_for_the_workers(tmp_path, monkeypatch):
    from harness.jobs import job_module

    from distributed_emb.cli import job_config

    monkeypatch.chdir(tmp_path)
    config = job_config(job_module("train_informin").JOB, ["--output", "rel/run"])
    assert config.output.dir == str(tmp_path / "rel" / "run")


def test_help_lists_every_key_with_its_default_meaning_and_range(tmp_path, capsys):
    """--help is read from each setting's one declaration (settings.py): its default, its help
    text and its allowed values."""
    import dataclasses

    from harness.jobs import job_module

    from distributed_emb.cli import run_job
    from distributed_emb.settings import key_docs

    default = tmp_path / "default.yaml"
    default.write_text("train:\n  learning_rate: 1.0e-5\n")
    job = dataclasses.replace(job_module("train_informin").JOB, default_config=default)
    with pytest.raises(SystemExit) as exit_info:
        run_job(job, ["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    docs = key_docs(TrainingConfig)
    assert len(docs) > 60
    for key, doc in docs.items():
        assert f"  {key} = " in text
        assert doc.help, f"{key} has no help: give its declaration a description"
    # Defaults: the built-in one, or the job's YAML value, marked as such.
    assert "  train.batch_size = 32\n" in text
    assert "  train.learning_rate = 1.0e-05  (from default.yaml; built-in 3.0e-05)" in text
    # The meaning and the allowed values come from the declaration.
    batch_size = text.split("  train.batch_size = 32\n")[1].split("\n  train.")[0]
    assert "rows per worker per step" in batch_size
    assert "[an integer, >= 2]" in batch_size
    mlm = text.split("  loss.mlm_probability = 0.15\n")[1].split("\n  loss.")[0]
    assert "[a number, in (0, 1)]" in mlm
    pooler = text.split("  model.pooler = mean\n")[1].split("\n  model.")[0]
    assert "['cls', 'cls_before_pooler', 'mean']" in " ".join(pooler.split())


@pytest.mark.parametrize(
    "name, config_class",
    [
        ("informin_default", "TrainingConfig"),
        ("informin_tiny", "TrainingConfig"),
        ("mcr2_finetune", "TrainingConfig"),
        ("infocse_default", "InfoCSEConfig"),
        ("tune_default", "SearchJobConfig"),
        ("tune_tiny", "SearchJobConfig"),
    ],
)
def test_shipped_yamls_list_only_what_differs(name, config_class):
    import yaml

    from distributed_emb.config import to_dict
    from distributed_emb.infocse.rounds_config import InfoCSEConfig
    from distributed_emb.tracking import flatten
    from distributed_emb.tune.search_config import SearchJobConfig

    cls = {c.__name__: c for c in (TrainingConfig, InfoCSEConfig, SearchJobConfig)}[config_class]
    built_in = to_dict(cls())
    listed = yaml.safe_load(open(f"jobs/configs/{name}.yaml"))
    same = []
    for key, value in flatten(listed).items():
        if key.startswith("search."):
            continue  # a mapping-valued setting: compared as a whole below
        node = built_in
        for part in key.split("."):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        if node == value:
            same.append(key)
    for key, value in listed.items():  # a mapping-valued setting (the search space) as a whole
        if key in built_in and isinstance(value, dict) and built_in[key] == value:
            same.append(key)
    assert not same, f"{name}.yaml repeats built-in defaults: {same}"


def test_the_default_training_yaml_reads_as_before():
    config = load_config(TrainingConfig, "jobs/configs/informin_default.yaml", [])
    assert config.train.learning_rate == 1e-5 and config.train.max_steps == 200  # unchanged


def test_a_job_writing_to_object_storage_keeps_its_run_log_there(tmp_path):
    """logs_on_storage: an output given as a URI (s3://… in use; file:// here, the same code
    path) gets logs/run.log with the job's lines; a local output keeps its own run.log and gets
    nothing uploaded."""
    import logging

    from distributed_emb.tracking import logs_on_storage

    logger = logging.getLogger("distributed_emb.vectors.corpus_embedding")
    with logs_on_storage(f"file://{tmp_path}/out"):
        logger.warning("embedded 40 rows")
    assert "embedded 40 rows" in (tmp_path / "out" / "logs" / "run.log").read_text()
    with logs_on_storage(str(tmp_path / "local")):
        logger.warning("mined 3 negatives")
    assert not (tmp_path / "local").exists()
