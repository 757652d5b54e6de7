from pathlib import Path

import pytest

from distributed_emb.checks import ConfigError, require_range
from distributed_emb.config import TrainingConfig, load_config, parse_override
from distributed_emb.train.train_config import TrainLoopConfig, validate_worker_counts


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


def test_an_elastic_range_need_not_divide_the_global_batch():
    # batch_size 4 × max 5 = 20 rows: 3 and 4 workers take ⌊20/W⌋ or ⌈20/W⌉ rows each.
    elastic = load_config(TrainingConfig, None, ["train.num_workers=[3,5]", "train.batch_size=4"])
    assert elastic.train.num_workers == [3, 5] and elastic.train.global_batch == 20
    validate_worker_counts(elastic.train)
    validate_worker_counts(TrainLoopConfig(num_workers=[1, 7], batch_size=2))
    with pytest.raises(ConfigError, match=r"train.num_workers.*\[3, 2\]: a range is \[min, max\]"):
        validate_worker_counts(TrainLoopConfig(num_workers=[3, 2]))
    with pytest.raises(ConfigError, match="train.num_workers"):
        validate_worker_counts(TrainLoopConfig(num_workers=[0, 2]))


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


# --- ranges: every numeric key, one helper, messages naming key and value ---------------------


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "train.max_grad_norm=-1",
            "train.max_grad_norm: must be > 0 or null, got -1 — gradient clipping bound; null: no",
        ),
        ("train.max_grad_norm=0", "train.max_grad_norm: must be > 0 or null, got 0"),
        ("eval.batch_size=0", "eval.batch_size: must be >= 1, got 0"),
        ("train.torch_threads=0", "train.torch_threads: must be >= 1 or null, got 0"),
        ("data.max_rows=0", "data.max_rows: must be >= 1 or null, got 0"),
        ("data.shuffle_seed=-1", "data.shuffle_seed: must be in [0, 4294967295] or null"),
        ("train.report_steps=0", "train.report_steps: must be >= 1 or null, got 0"),
        (
            "train.checkpoint_steps=5",
            "train.checkpoint_steps is now train.report_steps (every report evaluates",
        ),
        ("train.learning_rate=.inf", "train.learning_rate: must be a finite number, got inf"),
        ("train.learning_rate=1e999", "train.learning_rate: must be a finite number, got inf"),
        ("loss.temperature=.nan", "loss.temperature: must be a finite number, got nan"),
        ("train.weight_decay=-0.1", "train.weight_decay: must be >= 0, got -0.1"),
        ("train.warmup_ratio=1", "train.warmup_ratio: must be in [0, 1), got 1"),
        (
            "train.min_learning_rate_ratio=1.5",
            "train.min_learning_rate_ratio: must be in [0, 1], got 1.5 — where the linear decay",
        ),
        ("train.cpus_per_worker=0", "train.cpus_per_worker: must be > 0, got 0"),
        ("train.seed=-5", "train.seed: must be in [0, 4294967295], got -5"),
        ("train.deepspeed.zero_stage=4", "train.deepspeed.zero_stage: must be in [0, 3], got 4"),
        ("output.checkpoints_to_keep=0", "output.checkpoints_to_keep: must be >= 1, got 0"),
        ("output.dir=", "output.dir: is empty"),
        ("ray.num_cpus=0", "ray.num_cpus: must be >= 1 or null, got 0"),
        (
            "ray.object_store_memory_mb=10",
            "ray.object_store_memory_mb: must be >= 75 or null, got 10",
        ),
        (
            "ray.object_store_memory_mb=1073741824",
            "ray.object_store_memory_mb: must be in [75, ",  # this machine's memory, in MiB
        ),
    ],
)
def test_numeric_ranges_name_key_and_value(override, message):
    with pytest.raises(ConfigError) as error_info:
        load_config(TrainingConfig, None, [override])
    assert message in str(error_info.value)


def test_null_is_accepted_where_it_means_off_or_default():
    config = load_config(
        TrainingConfig,
        None,
        [
            "train.max_grad_norm=null",
            "train.torch_threads=null",
            "data.max_rows=null",
            "train.report_steps=null",
            "ray.num_cpus=null",
            "ray.object_store_memory_mb=null",
        ],
    )
    assert config.train.max_grad_norm is None and config.ray.object_store_memory_mb is None


def test_require_range_bounds_and_message():
    require_range(0.5, "k", 0, 1, low_open=True, high_open=True)
    require_range(None, "k", 1, allow_none=True)
    with pytest.raises(ConfigError, match=r"^k: must be in \(0, 1\), got 1$"):
        require_range(1, "k", 0, 1, low_open=True, high_open=True)
    with pytest.raises(ConfigError, match=r"^k: must be >= 1, got null$"):
        require_range(None, "k", 1)
    with pytest.raises(ConfigError, match=r"^k: must be >= 1, got True \(a count\)$"):
        require_range(True, "k", 1, why="a count")
    with pytest.raises(ConfigError, match="finite"):
        require_range(float("inf"), "k")


# --- model.path must be a model directory ----------------------------------------------------


def test_model_path_that_is_a_file_or_not_a_model_is_refused(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a sentence\n")
    with pytest.raises(ConfigError, match=r"model\.path: .*corpus\.txt is a file, not a model"):
        load_config(TrainingConfig, None, [f"model.path={corpus}"])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"is not a model directory: it has neither config\.json"):
        load_config(TrainingConfig, None, [f"model.path={empty}"])


@pytest.mark.parametrize("marker", ["config.json", "modules.json"])
def test_model_path_with_config_or_modules_json_is_accepted(tmp_path, marker):
    (tmp_path / marker).write_text("{}")
    assert load_config(TrainingConfig, None, [f"model.path={tmp_path}"]).model.path == str(tmp_path)


# --- text keys are taken literally -----------------------------------------------------------


def test_text_overrides_keep_their_literal_text():
    assert parse_override("data.path=2024", TrainingConfig) == ("data.path", "2024")
    assert parse_override("output.dir=/x #1", TrainingConfig) == ("output.dir", "/x #1")
    assert parse_override("output.dir=a: b", TrainingConfig) == ("output.dir", "a: b")
    assert parse_override("output.run_name=[1]", TrainingConfig) == ("output.run_name", "[1]")
    # A nullable text key still takes null; a choice loses stray blanks.
    assert parse_override("output.storage_path=null", TrainingConfig)[1] is None
    assert parse_override("model.pooler= mean", TrainingConfig) == ("model.pooler", "mean")
    # Numbers, lists and unknown keys stay YAML-typed.
    assert parse_override("train.batch_size=16", TrainingConfig) == ("train.batch_size", 16)
    assert parse_override("nonsense.key=3", TrainingConfig) == ("nonsense.key", 3)


def test_a_quoted_empty_override_is_the_empty_text_and_nothing_is_null():
    """`"prompts.query=''"` switches a model's query prompt off; `prompts.query=` (what a shell
    leaves of `prompts.query=''`) keeps the model's own."""
    from distributed_emb.vectors.search_config import SearchConfig

    assert parse_override("prompts.query=''", SearchConfig) == ("prompts.query", "")
    assert parse_override('prompts.document=""', SearchConfig) == ("prompts.document", "")
    assert parse_override("prompts.query=", SearchConfig) == ("prompts.query", None)
    assert parse_override("prompts.query=query: ", SearchConfig) == ("prompts.query", "query: ")


def test_output_dir_override_with_hash_and_number(tmp_path):
    config = load_config(TrainingConfig, None, [f"output.dir={tmp_path}/run #1"])
    assert config.output.dir == f"{tmp_path}/run #1"
    assert load_config(TrainingConfig, None, ["output.dir=2024"]).output.dir == "2024"


def test_output_flag_is_taken_literally(tmp_path, monkeypatch):
    from harness.jobs import job_module

    from distributed_emb.cli import job_config

    job = job_module("train_informin").JOB
    monkeypatch.chdir(tmp_path)
    config = job_config(job, ["--output", "/runs/x #1"])
    assert config.output.dir == "/runs/x #1"
    config = job_config(job, ["--output", "2024", "output.dir=other"])
    # The flag wins over an override (the job may make the directory absolute).
    assert Path(config.output.dir).resolve() == (tmp_path / "2024").resolve()


def test_values_are_set_unparsed_after_overrides():
    config = load_config(
        TrainingConfig, None, ["output.dir=from_override"], values={"output.dir": "x #1"}
    )
    assert config.output.dir == "x #1"


# --- the other configs: MCR², InfoCSE, Tune ---------------------------------------------------


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.weight_decay=-1", "train.weight_decay: must be >= 0, got -1 — AdamW weight decay"),
        ("train.seed=-1", "train.seed: must be in [0, 4294967295], got -1"),
        ("model.max_seq_length=0", "model.max_seq_length: must be >= 4 or null, got 0"),
        ("model.torch_threads=0", "model.torch_threads: must be >= 1 or null, got 0"),
        ("loss.pair_weight=-1", "loss.pair_weight: must be >= 0, got -1 — λ of the pair term"),
        ("pairs.min_score=6", "pairs.min_score: must be in [0, 5], got 6 — "),
        ("eval.transfer.kfold_c=[1.0, -2.0]", "eval.transfer.kfold_c[1]: must be > 0, got -2.0"),
        ("head.hidden_dims=[0]", "head.hidden_dims[0]: must be >= 1, got 0"),
        (
            "ray.object_store_memory_mb=1",
            "ray.object_store_memory_mb: must be >= 75 or null, got 1",
        ),
        ("loss.distill_weight=-1", "loss.distill_weight: must be >= 0, got -1 — μ of"),
        ("loss.distill_temperature=0", "loss.distill_temperature: must be > 0, got 0 — τ of"),
        ("head.init=zeros", "head.init: expected one of ["),
    ],
)
def test_mcr2_ranges(override, message):
    from distributed_emb.mcr2.compression_config import MCR2Config

    with pytest.raises(ConfigError) as error_info:
        load_config(MCR2Config, None, [override])
    assert message in str(error_info.value)


def test_mcr2_pca_start_is_refused_for_an_mlp_head():
    from distributed_emb.mcr2.compression_config import MCR2Config

    with pytest.raises(ConfigError, match="head.init: pca starts a linear head"):
        load_config(MCR2Config, None, ["head.init=pca", "head.hidden_dims=[16]"])
    # auto picks the start that fits: random for the MLP, no error.
    assert not load_config(MCR2Config, None, ["head.hidden_dims=[16]"]).head.starts_at_pca()
    assert load_config(MCR2Config, None, []).head.starts_at_pca()


@pytest.mark.parametrize(
    "override, message",
    [
        ("rounds.min_improvement=-1", "rounds.min_improvement: must be in [0, 100], got -1 — "),
        ("supervised.score_threshold=9", "supervised.score_threshold: must be in [0, 5], got 9 — "),
        ("annotation.torch_threads=0", "annotation.torch_threads: must be >= 1 or null, got 0"),
        ("annotation.idc.seed=-1", "annotation.idc.seed: must be in [0, 4294967295], got -1"),
        ("eval.batch_size=0", "eval.batch_size: must be >= 1, got 0"),
    ],
)
def test_infocse_ranges(override, message):
    from distributed_emb.infocse.rounds_config import InfoCSEConfig

    with pytest.raises(ConfigError) as error_info:
        load_config(InfoCSEConfig, None, [override])
    assert message in str(error_info.value)


@pytest.mark.parametrize(
    "source",
    [
        "org/documents",
        "wikitext",
        "hf://datasets/org/documents",
        "s3://bucket/docs.jsonl",
        "gs://b/d.parquet",
    ],
)
def test_infocse_hub_and_remote_documents_pass_validation(source):
    # The old check let a missing path through only for a format DocumentsConfig never had,
    # so hub-hosted documents could not be configured at all.
    from distributed_emb.infocse.rounds_config import InfoCSEConfig

    config = load_config(InfoCSEConfig, None, [f"documents.paths=[{source}]"])
    assert config.documents.paths == [source]


@pytest.mark.parametrize(
    "source, message",
    [
        ("corpus/docs.jsonl", "corpus/docs.jsonl does not exist"),
        ("/no/such/docs", "/no/such/docs does not exist"),
        ("{tmp}/shards/*.jsonl", "shards/*.jsonl matches no file"),
    ],
)
def test_infocse_missing_local_documents_fail(tmp_path, source, message):
    from distributed_emb.infocse.rounds_config import InfoCSEConfig

    source = source.replace("{tmp}", str(tmp_path))
    with pytest.raises(ConfigError, match=r"^documents\.paths: ") as error_info:
        load_config(InfoCSEConfig, None, [f"documents.paths=[{source}]"])
    assert message in str(error_info.value)


def test_local_glob_that_matches_is_accepted(tmp_path):
    from distributed_emb.infocse.rounds_config import InfoCSEConfig

    (tmp_path / "a.jsonl").write_text('{"id": "1", "sentences": ["x", "y"]}\n')
    load_config(InfoCSEConfig, None, [f"documents.paths=[{tmp_path}/*.jsonl]"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("tune.num_samples=0", "tune.num_samples: must be >= 1, got 0"),
        ("tune.max_t=0", "tune.max_t: must be >= 1 or null, got 0"),
        ("tune.max_concurrent_trials=0", "tune.max_concurrent_trials: must be >= 1 or null"),
        ("tune.max_failures=-2", "tune.max_failures: must be >= -1, got -2 — "),
        ("tune.reduction_factor=.inf", "tune.reduction_factor: must be a finite number"),
    ],
)
def test_tune_settings_ranges(override, message):
    from distributed_emb.tune.search_config import SearchJobConfig

    with pytest.raises(ConfigError) as error_info:
        load_config(SearchJobConfig, None, ["train.max_steps=20", override])
    assert message in str(error_info.value)


def test_relative_model_directories_become_absolute_for_the_workers(tmp_path, monkeypatch):
    """Ray Train workers run in other working directories: a model, head or teacher directory
    given relative to the job's is made absolute; hub names are left as given."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "mcr2-64").mkdir(parents=True)
    (tmp_path / "student").mkdir()
    config = TrainingConfig()
    config.model.path = "student"
    config.model.compression_head = "models/mcr2-64"
    config.loss.distill_teacher = "org/teacher"
    config.output.dir = "out"
    config.make_paths_absolute()
    assert config.model.path == str(tmp_path / "student")
    assert config.model.compression_head == str(tmp_path / "models" / "mcr2-64")
    assert config.loss.distill_teacher == "org/teacher"
    assert config.output.dir == str(tmp_path / "out")


@pytest.mark.parametrize("job", ["training", "mcr2", "infocse", "tune"])
def test_every_job_names_a_concept_with_the_same_key(job, tmp_path):
    """The one vocabulary: the model a job starts from and its optimizer's rate have one key in
    every configurable job, each refused by that name; the output directory is one key too."""
    from distributed_emb.infocse.rounds_config import InfoCSEConfig
    from distributed_emb.mcr2.compression_config import MCR2Config
    from distributed_emb.tune.search_config import SearchJobConfig

    cls = {"training": TrainingConfig, "mcr2": MCR2Config, "infocse": InfoCSEConfig,
           "tune": SearchJobConfig}[job]  # fmt: skip
    base = ["train.max_steps=10"] if job == "tune" else []  # ASHA's budget
    not_a_model = tmp_path / "corpus.txt"
    not_a_model.write_text("a sentence\n")
    with pytest.raises(ConfigError, match=r"^model\.path: .*is a file, not a model directory"):
        load_config(cls, None, [*base, f"model.path={not_a_model}"])
    with pytest.raises(ConfigError, match=r"^train\.learning_rate: must be > 0"):
        load_config(cls, None, [*base, "train.learning_rate=0"])
    for key in ("output.dir", "train.seed", "train.batch_size", "eval.senteval_dir", "ray.address"):
        config = load_config(cls, None, base)
        node = config
        for part in key.split("."):
            node = getattr(node, part)  # the key exists in this job's config
