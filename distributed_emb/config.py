"""Configuration as data: nested dataclasses loaded from YAML plus dotted `key=value` overrides.

Everything is validated here, before Ray starts: unknown keys, wrong types and impossible
values raise `ConfigError` naming the dotted key, so a typo costs seconds, not a cluster job.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration problem; the message names the offending key."""


# ---------------------------------------------------------------------------------------------
# Generic loading
# ---------------------------------------------------------------------------------------------


_YAML11_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Check `value` against `annotation`, converting only where it is lossless (int → float)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, option, key)
            except ConfigError as error:
                errors.append(str(error))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: {value!r} matches no type")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{key}: {value!r} is not one of {list(args)}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__} {value!r}")
        item_type = args[0] if args else Any
        return [_coerce(v, item_type, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
        return dict(value)
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__} {value!r}")
        return _build(annotation, value, key)
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {value!r}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if annotation is float:
        if isinstance(value, str) and _YAML11_FLOAT.fullmatch(value.strip()):
            # YAML 1.1 reads `3e-5` (no dot) as a string; it is plainly a number.
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported config type {annotation!r}")  # pragma: no cover


def _build(cls: type[T], values: dict, prefix: str = "") -> T:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in values:
        if key not in names:
            dotted = f"{prefix}.{key}" if prefix else key
            raise ConfigError(f"unknown config key {dotted!r}; known keys: {sorted(names)}")
    kwargs = {}
    for name, value in values.items():
        dotted = f"{prefix}.{name}" if prefix else name
        kwargs[name] = _coerce(value, hints[name], dotted)
    # Nested sections given partially keep their other defaults.
    return cls(**kwargs)


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{dotted}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """`loss.reconstruction_weight=0.4` → ("loss.reconstruction_weight", 0.4) (YAML-typed)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as error:
        raise ConfigError(f"{key}: cannot parse value {raw!r}: {error}") from error
    return key, value


def merge_trees(base: dict, update: dict) -> dict:
    """Nested dict `update` over `base` (YAML over defaults, a DeepSpeed JSON over ours)."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_trees(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_config(cls: type[T], yaml_path: str | None = None, overrides: list[str] = ()) -> T:
    """Build `cls` from a YAML file and dotted overrides; call `.validate()` if it has one."""
    tree: dict = {}
    if yaml_path is not None:
        path = Path(yaml_path)
        if not path.is_file():
            raise ConfigError(f"config file {yaml_path} does not exist")
        try:
            loaded = yaml.safe_load(path.read_text())
        except yaml.YAMLError as error:
            raise ConfigError(f"{yaml_path}: not valid YAML: {error}") from error
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{yaml_path}: top level must be a mapping")
        tree = loaded or {}
    override_tree: dict = {}
    for text in overrides:
        key, value = parse_override(text)
        _set_dotted(override_tree, key, value)
    config = _build(cls, merge_trees(tree, override_tree))
    validate = getattr(config, "validate", None)
    if callable(validate):
        validate()
    return config


def from_dict(cls: type[T], tree: dict) -> T:
    """Rebuild a config from `to_dict` output (on workers; validated once, on the driver)."""
    return _build(cls, tree)


def to_dict(config: Any) -> dict:
    return dataclasses.asdict(config)


def _looks_like_hub_name(text: str) -> bool:
    return re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", text) is not None


def _require(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{key}: {message}")


# ---------------------------------------------------------------------------------------------
# The training configuration (InforMin-CL; InfoCSE pair training reuses it)
# ---------------------------------------------------------------------------------------------


@dataclass
class ModelConfig:
    path: str | None = None  # None: the packaged all-MiniLM-L6-v2
    pooler: typing.Literal["cls", "cls_before_pooler", "mean"] = "mean"
    # SimCSE's MLP (dense + tanh) over the pooled vector: during training only, also exported,
    # or not at all.
    mlp_head: typing.Literal["train_only", "export", "none"] = "train_only"
    max_seq_length: int = 32
    trust_remote_code: bool = False


@dataclass
class DataConfig:
    path: str | None = None  # None: the shipped Wikipedia sentences
    format: typing.Literal["auto", "txt", "jsonl", "parquet", "hf"] = "auto"
    text_column: str = "text"
    hf_split: str = "train"
    # "sentences": one text per row, two dropout views (InforMin-CL / SimCSE).
    # "pairs": anchor/positive columns (InfoCSE), with an optional group column (document id)
    # whose rows are never used as each other's negatives.
    kind: typing.Literal["sentences", "pairs"] = "sentences"
    anchor_column: str = "anchor"
    positive_column: str = "positive"
    group_column: str | None = None
    deduplicate: bool = True
    max_rows: int | None = None  # take only the first N clean rows (quick runs)
    shuffle_seed: int | None = 0  # None: keep file order
    # > 1: sort each pool of this many batches by token length before batching (less padding,
    # see data/collate.py LengthGroupedCollator and docs/BENCHMARKS.md); 0 or 1: random batches.
    length_group_batches: int = 0


@dataclass
class LossConfig:
    temperature: float = 0.05
    # λ of InforMin-CL's reconstruction term ‖z¹ − z²‖².
    reconstruction_weight: float = 0.1
    # "normalized_mse": L2-normalise z, element-mean squared error (the authors' released code).
    # "squared_norm": raw z, mean over rows of the squared L2 distance (the paper's eq. 8).
    reconstruction_form: typing.Literal["normalized_mse", "squared_norm"] = "normalized_mse"
    mlm_weight: float = 0.0  # β
    mlm_probability: float = 0.15
    gather_negatives: bool = True  # negatives from every worker's batch (global batch)


@dataclass
class DeepSpeedConfig:
    zero_stage: int = 2
    config_path: str | None = None  # a DeepSpeed JSON whose keys override ours


@dataclass
class TrainLoopConfig:
    num_workers: int = 2
    use_gpu: bool = False
    cpus_per_worker: float = 1.0
    engine: typing.Literal["ddp", "deepspeed"] = "ddp"
    precision: typing.Literal["fp32", "bf16", "fp16"] = "fp32"
    batch_size: int = 32  # per worker; the global batch (negatives) is num_workers × this
    # GradCache: embed in mini-batches of this size to cap memory (None: one pass).
    mini_batch_size: int | None = None
    gradient_accumulation_steps: int = 1
    learning_rate: float = 3e-5
    weight_decay: float = 0.0
    warmup_ratio: float = 0.0
    max_grad_norm: float | None = 1.0
    epochs: int = 1
    max_steps: int | None = None  # stop after this many optimizer steps
    seed: int = 42
    torch_threads: int | None = None  # None: cpus_per_worker, rounded up
    max_failures: int = 0
    checkpoint_steps: int | None = None  # None: checkpoint at each evaluation
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)


@dataclass
class EvalConfig:
    eval_steps: int = 50
    senteval_dir: str | None = None  # None: the shipped STS-B
    max_pairs: int | None = None  # evaluate on the first N STS-B dev pairs (quick runs)
    batch_size: int = 128
    # Final STS-B test of the exported model (needs STS-B test in senteval_dir).
    test_after_training: bool = True
    # May the step-0 model (the starting point) be the one exported when no trained step beats
    # it? True for a single run (never ship worse than the start); InfoCSE rounds set False:
    # a round's model is what its training produced, and the rounds compare it with the start.
    start_is_candidate: bool = True


@dataclass
class OutputConfig:
    dir: str = "outputs/informin"
    checkpoints_to_keep: int = 2
    storage_path: str | None = None  # Ray Train storage (s3://, gs://, or a local path)
    run_name: str | None = None


@dataclass
class RayConfig:
    address: str | None = None  # None: connect to RAY_ADDRESS if set, else start locally
    num_cpus: int | None = None  # logical CPUs for a local instance (None: 2 × cores)
    object_store_memory_mb: int | None = 1024


@dataclass
class TrainingConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    train: TrainLoopConfig = field(default_factory=TrainLoopConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    ray: RayConfig = field(default_factory=RayConfig)

    def validate(self) -> None:
        m, d, lo, t, e = self.model, self.data, self.loss, self.train, self.eval
        if m.path is not None:
            _require(
                Path(m.path).exists() or _looks_like_hub_name(m.path),
                "model.path",
                f"{m.path!r} is not an existing directory (nor a hub name like 'org/model')",
            )
        _require(m.max_seq_length >= 4, "model.max_seq_length", "must be at least 4")
        if d.path is not None and not d.path.startswith(("s3://", "gs://", "hf://")):
            _require(
                Path(d.path).exists() or d.format == "hf", "data.path", f"{d.path} does not exist"
            )
        _require(d.length_group_batches >= 0, "data.length_group_batches", "must be >= 0")
        _require(lo.temperature > 0, "loss.temperature", f"must be > 0, got {lo.temperature}")
        _require(
            lo.reconstruction_weight >= 0,
            "loss.reconstruction_weight",
            f"must be >= 0, got {lo.reconstruction_weight}",
        )
        _require(lo.mlm_weight >= 0, "loss.mlm_weight", f"must be >= 0, got {lo.mlm_weight}")
        _require(0 < lo.mlm_probability < 1, "loss.mlm_probability", "must be in (0, 1)")
        _require(t.num_workers >= 1, "train.num_workers", "must be >= 1")
        _require(
            t.batch_size >= 2,
            "train.batch_size",
            f"must be >= 2 (in-batch negatives), got {t.batch_size}",
        )
        if t.mini_batch_size is not None:
            _require(
                1 <= t.mini_batch_size <= t.batch_size,
                "train.mini_batch_size",
                "must be between 1 and train.batch_size",
            )
        _require(
            t.gradient_accumulation_steps >= 1, "train.gradient_accumulation_steps", "must be >= 1"
        )
        _require(t.learning_rate > 0, "train.learning_rate", "must be > 0")
        _require(0 <= t.warmup_ratio < 1, "train.warmup_ratio", "must be in [0, 1)")
        _require(t.epochs >= 1, "train.epochs", "must be >= 1")
        if t.max_steps is not None:
            _require(t.max_steps >= 1, "train.max_steps", "must be >= 1")
        _require(t.cpus_per_worker > 0, "train.cpus_per_worker", "must be > 0")
        _require(t.max_failures >= -1, "train.max_failures", "must be >= -1 (-1: unlimited)")
        _require(
            t.deepspeed.zero_stage in (0, 1, 2, 3),
            "train.deepspeed.zero_stage",
            "must be 0, 1, 2 or 3",
        )
        if t.deepspeed.config_path is not None:
            _require(
                Path(t.deepspeed.config_path).is_file(),
                "train.deepspeed.config_path",
                f"{t.deepspeed.config_path} does not exist",
            )
        if t.precision == "fp16":
            _require(t.use_gpu, "train.precision", "fp16 needs a GPU; use bf16 or fp32 on CPU")
        _require(e.eval_steps >= 1, "eval.eval_steps", "must be >= 1")
        if e.max_pairs is not None:
            _require(e.max_pairs >= 3, "eval.max_pairs", "must be >= 3 (Spearman)")
        if e.senteval_dir is not None:
            _require(
                Path(e.senteval_dir).is_dir(),
                "eval.senteval_dir",
                f"{e.senteval_dir} is not a directory",
            )
        _require(self.output.checkpoints_to_keep >= 1, "output.checkpoints_to_keep", "must be >= 1")

    @property
    def model_path(self) -> str:
        from distributed_emb.paths import default_model_path

        return self.model.path or default_model_path()


def training_config_from_dict(tree: dict) -> TrainingConfig:
    return from_dict(TrainingConfig, tree)
