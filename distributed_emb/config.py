"""Configuration as data: nested dataclasses loaded from YAML plus dotted `key=value` overrides.

Everything is validated here, before Ray starts: unknown keys, wrong types and impossible
values raise `ConfigError` naming the dotted key, so a typo costs seconds, not a cluster job.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from distributed_emb.checks import (  # noqa: F401 - re-exported: every section's checks
    MAX_SEED,
    ConfigError,
    require_range,
    require_seed,
)
from distributed_emb.checks import require as _require
from distributed_emb.data.sources import is_hub_name, is_remote
from distributed_emb.losses.mcr2 import MCR2LossConfig
from distributed_emb.losses.objective import LossConfig
from distributed_emb.paths import default_model_path

T = TypeVar("T")


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
        if not math.isfinite(value):
            # YAML's .inf / .nan: no knob means anything useful at infinity, and NaN compares
            # false with every bound, so it would slip past each range check below.
            raise ConfigError(f"{key}: must be a finite number, got {value!r}")
        return float(value)
    if annotation is str:
        if value is None:
            raise ConfigError(f"{key}: expected a string, got null")
        if not isinstance(value, str):
            # Only a YAML file gets here (overrides of text keys are taken literally).
            raise ConfigError(
                f"{key}: expected a string, got {value!r}; quote it in YAML ('{value}')"
            )
        return value
    raise ConfigError(f"{key}: unsupported config type {annotation!r}")  # pragma: no cover


# Keys that were renamed: the old name fails with the new one, never silently.
RENAMED_KEYS = {
    "data.shuffle_buffer_rows": (
        "data.block_rows",
        "rows are shuffled within each source block of data.block_rows rows, in an order that "
        "does not depend on the number of workers",
    ),
    "train.checkpoint_steps": (
        "train.report_steps",
        "every report evaluates STS-B dev as well as writing a checkpoint",
    ),
}
# Keys that were removed: they fail with why, never silently.
REMOVED_KEYS = {
    "rounds.arrange_pairs": (
        "the annotation writes each round's pairs in a seeded order spread over documents, on "
        "the cluster, and training streams them; no option is needed (docs/INFOCSE.md)"
    ),
}


# Keys that moved to the one vocabulary (a concept has one key in every job): a config class
# lists its own in `KEY_ALIASES` (old → new; a key ending in "." moves a whole section, "" is the
# top level). The old key still works for now, with a warning naming the new one.
log = logging.getLogger("distributed_emb")


def _aliases(cls: type) -> list[tuple[str, str]]:
    """The class's aliases, exact keys before sections and longer before shorter, so that
    `optim.lr` is matched before the section `optim.`."""
    table = getattr(cls, "KEY_ALIASES", {}) or {}
    return sorted(table.items(), key=lambda item: (item[0].endswith("."), -len(item[0])))


def current_key(cls: type, dotted: str, warn: bool = True) -> str:
    """`dotted` in the one vocabulary: an old key of `cls` becomes its new one (warned)."""
    for old, new in _aliases(cls):
        if old.endswith("."):
            if dotted.startswith(old):
                moved = new + dotted[len(old) :]
                break
        elif dotted == old:
            moved = new
            break
    else:
        return dotted
    if warn:
        log.warning("%s is now %s; the old key still works for now", dotted, moved)
    return moved


def flatten(tree: dict, prefix: str = "") -> dict:
    """{"train": {"learning_rate": 3e-5}} → {"train.learning_rate": 3e-5} (an empty mapping is
    a leaf)."""
    flat = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{dotted}."))
        else:
            flat[dotted] = value
    return flat


def lookup(tree: dict, dotted: str) -> tuple[bool, Any]:
    """(found, value) of the dotted key in the nested `tree`."""
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _moved_to_current_keys(cls: type, tree: dict) -> dict:
    """A YAML tree with `cls`'s old keys moved to their new places (warned). Where the tree
    also gives the new key, the new key's value wins."""
    moved_tree: dict = {}
    for key, value in tree.items():
        _set_dotted(moved_tree, key, value, merge=True)
    for old, _new in _aliases(cls):
        path = old.rstrip(".").split(".")
        node = moved_tree
        for part in path[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
            if node is None:
                break
        if not isinstance(node, dict) or path[-1] not in node:
            continue
        value = node.pop(path[-1])
        if old.endswith(".") and isinstance(value, dict):
            leaves = list(flatten(value).items())
        else:
            leaves = [("", value)]
        moves = []
        for leaf, leaf_value in leaves:
            old_key = f"{old}{leaf}" if old.endswith(".") else old
            new_key = current_key(cls, old_key, warn=False)
            moves.append(f"{old_key} → {new_key}")
            if not lookup(moved_tree, new_key)[0]:
                _set_dotted(moved_tree, new_key, leaf_value)
        if moves:
            log.warning("renamed keys: %s; the old keys still work for now", ", ".join(moves))
    return moved_tree


def _build(cls: type[T], values: dict, prefix: str = "") -> T:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in values:
        if key not in names:
            dotted = f"{prefix}.{key}" if prefix else key
            if dotted in RENAMED_KEYS:
                new, why = RENAMED_KEYS[dotted]
                raise ConfigError(f"{dotted} is now {new} ({why})")
            if dotted in REMOVED_KEYS:
                raise ConfigError(f"{dotted} was removed: {REMOVED_KEYS[dotted]}")
            raise ConfigError(f"unknown config key {dotted!r}; known keys: {sorted(names)}")
    kwargs = {}
    for name, value in values.items():
        dotted = f"{prefix}.{name}" if prefix else name
        kwargs[name] = _coerce(value, hints[name], dotted)
    # Nested sections given partially keep their other defaults.
    return cls(**kwargs)


def _set_dotted(tree: dict, dotted: str, value: Any, merge: bool = False) -> None:
    """Set `dotted` in the nested `tree`; `merge`: a mapping merges into one already there."""
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{dotted}: {part!r} is a value, not a section")
        node = child
    if merge and isinstance(value, dict) and isinstance(node.get(parts[-1]), dict):
        node[parts[-1]] = merge_trees(node[parts[-1]], value)
    else:
        node[parts[-1]] = value


_YAML_NULLS = ("", "~", "null", "Null", "NULL")


def _field_annotation(cls: type | None, dotted: str) -> Any:
    """The annotation of the field `dotted` names in dataclass `cls` (None: not a field)."""
    annotation: Any = cls
    for part in dotted.split("."):
        if not (isinstance(annotation, type) and dataclasses.is_dataclass(annotation)):
            return None
        annotation = typing.get_type_hints(annotation).get(part)
        if annotation is None:
            return None
    return annotation


def _text_kind(annotation: Any) -> tuple[str | None, bool]:
    """("str" | "choice" | None, may be null) for str, a Literal of strings, and their Optional."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        kind = _text_kind(options[0])[0] if len(options) == 1 else None
        return kind, type(None) in args
    if typing.get_origin(annotation) is typing.Literal:
        return ("choice" if all(isinstance(a, str) for a in args) else None), False
    return ("str" if annotation is str else None), False


def parse_override(text: str, cls: type | None = None) -> tuple[str, Any]:
    """`loss.reconstruction_weight=0.4` → ("loss.reconstruction_weight", 0.4) (YAML-typed).

    Given the config class, a key whose field is text (paths, names, choices) keeps the text
    after `=` literally: YAML would turn `output.dir=/x #1` into "/x" (a comment) and
    `data.path=2024` into an integer. Only null (or nothing) means None, where None is allowed.
    """
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r} has an empty key")
    if cls is not None:
        key = current_key(cls, key)
    kind, nullable = _text_kind(_field_annotation(cls, key))
    if kind is not None:
        if nullable and raw.strip() in _YAML_NULLS:
            return key, None
        # A path keeps every character; a choice (pooler=mean) never has outer blanks.
        return key, raw if kind == "str" else raw.strip()
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


def load_config(
    cls: type[T],
    yaml_path: str | None = None,
    overrides: list[str] = (),
    values: dict[str, Any] | None = None,
) -> T:
    """Build `cls` from a YAML file and dotted overrides; call `.validate()` if it has one.

    `values`: dotted key → value, set as given (not parsed) after the overrides; for flags
    such as `--output DIR`, whose text is the value whatever it looks like.
    """
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
        tree = _moved_to_current_keys(cls, loaded or {})
    override_tree: dict = {}
    for text in overrides:
        key, value = parse_override(text, cls)
        _set_dotted(override_tree, key, value)
    for key, value in (values or {}).items():
        _set_dotted(override_tree, current_key(cls, key), value)
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


# Ray refuses a smaller object store (ray_constants.OBJECT_STORE_MINIMUM_MEMORY_BYTES).
MIN_OBJECT_STORE_MB = 75


def require_sources(paths: list[str], key: str) -> None:
    """Each data source exists here, unless data/sources.py reads it from elsewhere.

    Object-store URIs (s3://, gs://, ...) and hub datasets ('org/name', 'name',
    hf://datasets/org/name) cannot be checked here; a local path, directory or glob must
    exist or match. 'corpus/docs.jsonl' is a missing file, not a hub name (it has a suffix).
    """
    for path in paths:
        if is_remote(path) or is_hub_name(path):
            continue
        if any(ch in path for ch in "*?["):
            _require(
                bool(glob.glob(os.path.expanduser(path), recursive=True)),
                key,
                f"{path} matches no file",
            )
            continue
        _require(
            Path(path).expanduser().exists(),
            key,
            f"{path} does not exist (a Hugging Face hub dataset is named 'org/name' or "
            "hf://datasets/org/name)",
        )


def require_model_dir(path: str | None, key: str) -> None:
    """A model path must be a hub name ('org/model') or an existing model directory.

    Checked here, before Ray starts: a corpus file or an empty directory given as the model
    otherwise fails minutes later inside a Ray worker with a transformers traceback.
    """
    if path is None or "://" in path:  # on object storage: read where it is used
        return
    local = Path(path)
    if not local.exists():
        _require(
            _looks_like_hub_name(path),
            key,
            f"{path!r} is not an existing directory (nor a hub name like 'org/model')",
        )
        return
    _require(
        local.is_dir(),
        key,
        f"{path} is a file, not a model directory (expected a directory with config.json, "
        "or modules.json for a sentence-transformers model)",
    )
    _require(
        (local / "config.json").is_file() or (local / "modules.json").is_file(),
        key,
        f"{path} is not a model directory: it has neither config.json (Hugging Face) "
        "nor modules.json (sentence-transformers)",
    )
    for name in ("config.json", "modules.json"):
        # Read by every worker that loads the model: a broken one fails here, not in them.
        if (local / name).is_file():
            try:
                json.loads((local / name).read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as error:
                raise ConfigError(f"{key}: {local / name} is not valid JSON ({error})") from None


def _physical_memory_mb() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 1024**2
    except (AttributeError, ValueError, OSError):  # not POSIX: no bound
        return None


def validate_ray_config(ray: RayConfig, prefix: str = "ray") -> None:
    require_range(ray.num_cpus, f"{prefix}.num_cpus", 1, allow_none=True)
    # The size of a Ray started here (ignored when joining a cluster): it cannot exceed this
    # machine's memory; a value in bytes instead of MiB is the usual way to get there.
    memory = _physical_memory_mb()
    require_range(
        ray.object_store_memory_mb,
        f"{prefix}.object_store_memory_mb",
        MIN_OBJECT_STORE_MB,
        memory,
        allow_none=True,
        why=f"MiB: at least Ray's minimum of {MIN_OBJECT_STORE_MB}"
        + (f", at most this machine's {memory} MiB of memory" if memory else "")
        + "; null lets Ray choose",
    )


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
    # An MCR² compression head to fine-tune end to end with the encoder: a models/mcr2-<dim>
    # directory written by jobs/train_mcr2.py (its compression_head.safetensors); the
    # encoder's vectors pass through it, in training, selection and the export.
    compression_head: str | None = None


@dataclass
class DataConfig:
    path: str | None = None  # None: the shipped Wikipedia sentences
    # Files are read by their suffixes (data/sources.py): .txt .jsonl/.json .parquet .arrow,
    # optionally .gz/.zst/.bz2; a path may be a file, directory, glob, s3:// or gs:// URI, a
    # saved Hugging Face dataset or a hub name (org/name).
    text_column: str = "text"
    hf_split: str = "train"
    # "sentences": one text per row, two dropout views (InforMin-CL / SimCSE).
    # "pairs": anchor/positive columns (InfoCSE).
    # Either kind: an optional group column (document id) whose rows are never used as each
    # other's negatives, and which are MCR²'s clusters (loss.mcr2_weight).
    kind: typing.Literal["sentences", "pairs"] = "sentences"
    anchor_column: str = "anchor"
    positive_column: str = "positive"
    group_column: str | None = None
    # Exact, distributed de-duplication of identical rows: an all-to-all pass over the whole
    # corpus before the first step (docs/BENCHMARKS.md), so off by default.
    deduplicate: bool = False
    dedup_partitions: int = 16  # hash partitions of the de-duplication shuffle
    max_rows: int | None = None  # take only the first N clean rows (quick runs)
    # Rows longer than this many characters are dropped and counted (`too_long`) before
    # tokenisation: no real sentence is this long, a broken file's megabyte "line" is.
    max_chars: int = 20_000
    block_rows: int = 10_000  # rows per block read (the unit of parallelism and counting)
    # Shuffling (data/epoch_order.py): files in an order drawn per epoch, the rows of each
    # block of data.block_rows in an order drawn per epoch; the same for any worker count.
    # None: file order.
    shuffle_seed: int | None = 0
    # Where text becomes token ids: "ray_data" in a Ray Data stage on the cluster's CPUs (what
    # GPUs need: data/tokenize.py), "worker" in each Train worker, "auto" = ray_data on GPU runs.
    tokenize_in: typing.Literal["auto", "worker", "ray_data"] = "auto"
    tokenize_batch_rows: int = 1024  # rows per tokenising task call
    # Token-id shards written once and reused by later epochs, resumed runs and every Tune
    # trial (data/token_cache.py): "auto" = on for Tune searches and for runs that tokenise
    # in Ray Data and read the whole corpus (train.max_steps unset).
    token_cache: typing.Literal["auto", "on", "off"] = "auto"
    token_cache_dir: str | None = None  # local or s3://...; None: <storage path>/token_cache
    # > 1: sort each pool of this many global batches by length before cutting it (less
    # padding: data/global_batches.py, docs/BENCHMARKS.md); 0 or 1: batches as they come.
    length_group_batches: int = 0


@dataclass
class DeepSpeedConfig:
    zero_stage: int = 2
    config_path: str | None = None  # a DeepSpeed JSON whose keys override ours
    # DeepSpeed checkpoints are pickles: by default they are restored with
    # torch.load(weights_only=True) and a short allowlist of plain-data DeepSpeed classes.
    # true: full unpickling (can run code), only for checkpoints you wrote yourself.
    trust_checkpoints: bool = False


@dataclass
class TrainLoopConfig:
    # Ray Train workers: a number, or [min, max] for an elastic group that starts once `min`
    # fit, grows as nodes arrive and shrinks when one is lost (Ray Train's elastic worker
    # groups). The global batch stays `batch_size × max` whatever the group's size: each of W
    # workers takes global/W rows, so it must divide by every size in the range.
    num_workers: int | list[int] = 2
    # An elastic group checks this often whether more workers fit (Ray Train's
    # elastic_resize_monitor_interval_s); growing restarts the group from its last checkpoint.
    elastic_resize_interval_s: float = 60.0
    use_gpu: bool = False
    cpus_per_worker: float = 1.0
    engine: typing.Literal["ddp", "deepspeed"] = "ddp"
    # "auto": bf16 autocast where it is faster (GPUs with bf16; CPUs with native bf16 that
    # measure faster at start-up), else fp32 (train/precision.py). Losses stay fp32.
    precision: typing.Literal["auto", "fp32", "bf16", "fp16"] = "fp32"
    # How the global batch (num_workers × batch_size) is laid out over processes.
    # "as_set": exactly num_workers × batch_size. "auto" (one node): on a CPU-only node one
    # worker holds the whole global batch with every core as torch threads; on a GPU node one
    # worker per GPU (train/layout.py). Several nodes: as set.
    layout: typing.Literal["auto", "as_set"] = "as_set"
    # torch.compile the encoder's transformer (model/encoder.py); its batches are padded to a
    # multiple of 8 tokens so the compiled graph meets few shapes. Off: on a 2-core CPU it
    # measured 0.97x eager after 50-100 s of compiling (docs/BENCHMARKS.md); the gain it
    # exists for is on GPUs (bench/gpu_check.sh measures it).
    compile: bool = False
    # Per worker (at the largest group); the global batch (negatives) is num_workers × this.
    batch_size: int = 32
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
    # Report (evaluate STS-B dev and write a checkpoint) also every N steps; None: only
    # at eval.eval_steps.
    report_steps: int | None = None
    # CPUs kept free of Train workers for Ray Data's read/clean/feed tasks (whole CPUs: each
    # task takes one); the resource plan (resource_plan.py) checks the cluster holds both.
    data_cpus: float = 1.0
    # When the cluster's CPUs cannot hold num_workers × cpus_per_worker plus data_cpus, reserve
    # a smaller fractional CPU per worker (at least 0.25; torch threads unchanged) instead of
    # failing.
    lower_cpus_to_fit: bool = True
    # Fail the run when a task, actor or worker group of the job has waited this long for
    # resources (a pipeline that can never be scheduled, nodes that never come); null: never.
    stall_timeout_s: float | None = 600.0
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)

    @property
    def elastic(self) -> bool:
        return isinstance(self.num_workers, (list, tuple))

    @property
    def min_workers(self) -> int:
        return self.num_workers[0] if self.elastic else self.num_workers

    @property
    def max_workers(self) -> int:
        return self.num_workers[-1] if self.elastic else self.num_workers

    @property
    def global_batch(self) -> int:
        """Rows of one micro-step over the whole group, the same for every group size."""
        return self.max_workers * self.batch_size

    def worker_counts(self) -> range:
        return range(self.min_workers, self.max_workers + 1)


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
    # Score the starting model (step 0) before training. InfoCSE rounds and the side-by-side
    # arms set False: their start was scored already, and the pass is a whole dev evaluation.
    score_start: bool = True


@dataclass
class OutputConfig:
    dir: str = "outputs/informin"
    checkpoints_to_keep: int = 2
    storage_path: str | None = None  # Ray Train storage (s3://, gs://, or a local path)
    run_name: str | None = None
    # An earlier run under the same run name (train/run_identity.py): "auto" continues it when
    # its settings match and refuses otherwise; "must" (--resume) requires one to continue;
    # "anyway" (--resume-anyway) continues it with different settings; "overwrite"
    # (--overwrite) deletes it (checkpoints, model/, metrics.json) and starts again.
    resume: typing.Literal["auto", "must", "anyway", "overwrite"] = "auto"
    # Audit trail: each rank appends the row ids of every batch it trains on to
    # <dir>/trained_rows/rank<r>.jsonl (one line a batch: attempt, epoch, step, row ids).
    row_log: bool = False


@dataclass
class RayConfig:
    address: str | None = None  # None: connect to RAY_ADDRESS if set, else start locally
    num_cpus: int | None = None  # logical CPUs for a local instance (None: the cores)
    object_store_memory_mb: int | None = 1024


@dataclass
class LoggingConfig:
    # Event files in <output.dir>/tensorboard/, written by rank 0 (view: tensorboard --logdir).
    tensorboard: bool = True
    wandb: bool = False  # Weights & Biases through Ray's setup_wandb (needs wandb + an API key)
    mlflow: bool = False  # MLflow through Ray's setup_mlflow (MLFLOW_TRACKING_URI or a file)
    # A progress line (console, run.log, train_log.jsonl, the sinks above) every N steps.
    logging_steps: int = 10
    # The training progress bar. auto: only when the driver's stderr is a terminal (redrawn
    # into a log file, each redraw becomes a line); the progress lines above always print.
    progress_bar: typing.Literal["auto", "on", "off"] = "auto"


@dataclass
class ExportConfig:
    # The exported model's max_seq_length; None: the base model's own limit (model.max_seq_length
    # is the training length, a speed choice, not what users of the export should get).
    max_seq_length: int | None = None
    push_to_hub: bool = False  # upload the export after training (needs HF_HUB_OFFLINE=0)
    hub_model_id: str | None = None  # the hub repository, e.g. my-org/informin-minilm
    license: str | None = None  # the model card's licence; None: the base model card's


def validate_logging_config(c: LoggingConfig, key: str = "logging") -> None:
    require_range(c.logging_steps, f"{key}.logging_steps", 1)


def validate_export_config(c: ExportConfig, key: str = "export") -> None:
    """Value checks, plus the hub being reachable at all: a push that can only fail must fail
    here, before hours of training, not after them."""
    require_range(c.max_seq_length, f"{key}.max_seq_length", 4, allow_none=True)
    if c.hub_model_id is not None:
        _require(
            _looks_like_hub_name(c.hub_model_id),
            f"{key}.hub_model_id",
            f"{c.hub_model_id!r} is not a hub repository id like 'my-org/my-model'",
        )
    if c.push_to_hub:
        _require(
            c.hub_model_id is not None,
            f"{key}.hub_model_id",
            f"must be set when {key}.push_to_hub is true (e.g. my-org/informin-minilm)",
        )
        _require(
            os.environ.get("HF_HUB_OFFLINE", "0").strip().lower() in ("0", "false", "no", ""),
            f"{key}.push_to_hub",
            "the hub is off (HF_HUB_OFFLINE=1, our jobs' default); run with HF_HUB_OFFLINE=0 "
            "and a token (HF_TOKEN or `hf auth login`), or drop export.push_to_hub",
        )


@dataclass
class TrainingConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    train: TrainLoopConfig = field(default_factory=TrainLoopConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    export: ExportConfig = field(default_factory=ExportConfig)

    def validate(self) -> None:
        m, d, lo, t, e, o = self.model, self.data, self.loss, self.train, self.eval, self.output
        require_model_dir(m.path, "model.path")
        require_range(m.max_seq_length, "model.max_seq_length", 4)
        if d.path is not None:
            require_sources([d.path], "data.path")
        require_range(d.max_rows, "data.max_rows", 1, allow_none=True)
        require_seed(d.shuffle_seed, "data.shuffle_seed", allow_none=True)
        require_range(d.length_group_batches, "data.length_group_batches", 0)
        require_range(d.max_chars, "data.max_chars", 1)
        require_range(d.block_rows, "data.block_rows", 1)
        require_range(d.dedup_partitions, "data.dedup_partitions", 1)
        require_range(d.tokenize_batch_rows, "data.tokenize_batch_rows", 1)
        require_range(lo.temperature, "loss.temperature", 0, low_open=True)
        require_range(lo.reconstruction_weight, "loss.reconstruction_weight", 0)
        require_range(lo.mlm_weight, "loss.mlm_weight", 0)
        require_range(
            lo.mlm_probability, "loss.mlm_probability", 0, 1, low_open=True, high_open=True
        )
        require_range(lo.contrastive_weight, "loss.contrastive_weight", 0)
        require_range(lo.distill_weight, "loss.distill_weight", 0)
        require_range(lo.mcr2_weight, "loss.mcr2_weight", 0)
        _require(
            lo.contrastive_weight
            + lo.reconstruction_weight
            + lo.mlm_weight
            + lo.distill_weight
            + lo.mcr2_weight
            > 0,
            "loss",
            "every term has weight 0 (contrastive, reconstruction, mlm, distill, mcr2): "
            "nothing to train",
        )
        if m.compression_head is not None:
            # The head's directory and the pooler it read: the training job's checks
            # (train/job.py check_compression_head), once files may be read.
            _require(
                m.mlp_head == "none",
                "model.mlp_head",
                "must be none with model.compression_head: the head reads the pooled vector",
            )
        if lo.mcr2_weight > 0:
            validate_mcr2_loss(lo.mcr2, "loss.mcr2")
            _require(
                d.group_column is not None or lo.mcr2.compress_weight == 0,
                "data.group_column",
                "loss.mcr2_weight > 0 packs each group (document or cluster) of a batch: name "
                "the column holding its id, or set loss.mcr2.compress_weight to 0",
            )
            _require(
                m.mlp_head != "train_only",
                "model.mlp_head",
                "train_only with loss.mcr2_weight > 0 would shape the MLP's output, which the "
                "export drops; use none",
            )
        teacher_needed = lo.distill_weight > 0 or (
            lo.mcr2_weight > 0 and lo.mcr2.distill_weight > 0
        )
        if lo.distill_teacher is not None:
            require_model_dir(lo.distill_teacher, "loss.distill_teacher")
        if lo.distill_weight > 0:
            _require(
                lo.distill_teacher is not None,
                "loss.distill_teacher",
                "loss.distill_weight > 0 needs a teacher model (a path or hub name)",
            )
            _require(
                m.mlp_head != "train_only",
                "model.mlp_head",
                "train_only with loss.distill_weight > 0 would distil the MLP's output, which the "
                "export drops; use none (or export)",
            )
        if not teacher_needed:
            _require(
                lo.distill_teacher is None,
                "loss.distill_teacher",
                f"{lo.distill_teacher} is set but loss.distill_weight is 0 and no MCR² term "
                "(loss.mcr2_weight, loss.mcr2.distill_weight) uses it: give a term a weight or "
                "drop the teacher",
            )
        validate_worker_counts(t)
        require_range(
            t.elastic_resize_interval_s, "train.elastic_resize_interval_s", 0, low_open=True
        )
        require_range(t.cpus_per_worker, "train.cpus_per_worker", 0, low_open=True)
        require_range(t.batch_size, "train.batch_size", 2, why="in-batch negatives")
        require_range(
            t.mini_batch_size,
            "train.mini_batch_size",
            1,
            t.batch_size,
            allow_none=True,
            why="at most train.batch_size",
        )
        require_range(t.gradient_accumulation_steps, "train.gradient_accumulation_steps", 1)
        require_range(t.learning_rate, "train.learning_rate", 0, low_open=True)
        require_range(t.weight_decay, "train.weight_decay", 0)
        require_range(t.warmup_ratio, "train.warmup_ratio", 0, 1, high_open=True)
        # clip_grad_norm_ scales gradients by max_norm / norm: a negative bound reverses them
        # (training climbs the loss) and 0 zeroes them; null turns clipping off.
        require_range(
            t.max_grad_norm,
            "train.max_grad_norm",
            0,
            low_open=True,
            allow_none=True,
            why="null turns clipping off; <= 0 would zero or reverse the gradients",
        )
        require_range(t.epochs, "train.epochs", 1)
        require_range(t.max_steps, "train.max_steps", 1, allow_none=True)
        require_seed(t.seed, "train.seed")
        require_range(t.torch_threads, "train.torch_threads", 1, allow_none=True)
        require_range(t.max_failures, "train.max_failures", -1, why="-1: unlimited")
        require_range(t.report_steps, "train.report_steps", 1, allow_none=True)
        require_range(t.data_cpus, "train.data_cpus", 1, why="Ray Data tasks take 1 CPU each")
        require_range(t.stall_timeout_s, "train.stall_timeout_s", 0, low_open=True, allow_none=True)
        require_range(t.deepspeed.zero_stage, "train.deepspeed.zero_stage", 0, 3)
        if t.deepspeed.config_path is not None:
            _require(
                Path(t.deepspeed.config_path).is_file(),
                "train.deepspeed.config_path",
                f"{t.deepspeed.config_path} does not exist",
            )
        if t.precision == "fp16":
            _require(t.use_gpu, "train.precision", "fp16 needs a GPU; use bf16 or fp32 on CPU")
        require_range(e.eval_steps, "eval.eval_steps", 1)
        require_range(e.max_pairs, "eval.max_pairs", 3, allow_none=True, why="Spearman")
        require_range(e.batch_size, "eval.batch_size", 1)
        if e.senteval_dir is not None:
            _require(
                Path(e.senteval_dir).is_dir(),
                "eval.senteval_dir",
                f"{e.senteval_dir} is not a directory",
            )
        _require(bool(o.dir.strip()), "output.dir", "is empty")
        require_range(o.checkpoints_to_keep, "output.checkpoints_to_keep", 1)
        validate_ray_config(self.ray)
        validate_logging_config(self.logging)
        validate_export_config(self.export)

    @property
    def model_path(self) -> str:
        """The encoder to start from, as a directory this process can open (a model on object
        storage is copied to the node once: storage.local_model_dir)."""
        from distributed_emb.storage import local_model_dir

        return local_model_dir(self.model.path or default_model_path())

    def make_paths_absolute(self) -> None:
        """output.dir, and model directories given relative to this directory, made absolute:
        Ray Train workers run in other working directories (on a cluster, other machines;
        rank 0 writes run.log there, every worker loads the models). A hub name, or a path
        that is not a directory here, stays as given."""
        self.output.dir = str(Path(self.output.dir).expanduser().resolve())
        for section, key in (
            (self.model, "path"),
            (self.model, "compression_head"),
            (self.loss, "distill_teacher"),
        ):
            value = getattr(section, key)
            if value is not None and Path(value).expanduser().is_dir():
                setattr(section, key, str(Path(value).expanduser().resolve()))


def training_sections(config: TrainingConfig) -> TrainingConfig:
    """The TrainingConfig part of a config that extends it (InfoCSE's, a search's): its own
    sections, shared, not copied (copy before changing one for a round or a trial)."""
    return TrainingConfig(
        **{f.name: getattr(config, f.name) for f in dataclasses.fields(TrainingConfig)}
    )


def validate_worker_counts(t: TrainLoopConfig) -> None:
    """`train.num_workers`: a count, or [min, max] whose every size splits the global batch."""
    if not t.elastic:
        require_range(t.num_workers, "train.num_workers", 1)
        return
    _require(
        len(t.num_workers) == 2 and 1 <= t.num_workers[0] <= t.num_workers[1],
        "train.num_workers",
        f"{list(t.num_workers)}: a range is [min, max] with 1 <= min <= max",
    )
    uneven = [w for w in t.worker_counts() if t.global_batch % w]
    if uneven:
        step = math.lcm(*t.worker_counts())
        unit = step // math.gcd(step, t.max_workers)  # batch_size must be a multiple of this
        suggestion = -(-t.batch_size // unit) * unit
        _require(
            False,
            "train.num_workers",
            f"{list(t.num_workers)}: the global batch {t.global_batch} (train.batch_size "
            f"{t.batch_size} × max {t.max_workers}) does not split evenly over {uneven} "
            f"workers (each of W workers takes global/W rows); use train.batch_size="
            f"{suggestion} (a global batch of {suggestion * t.max_workers}) or narrow the range",
        )


def validate_mcr2_loss(c: MCR2LossConfig, key: str) -> None:
    """The MCR² loss's own keys (the compression job's `loss` and training's `loss.mcr2`)."""
    require_range(c.eps, f"{key}.eps", 0, low_open=True)
    require_range(c.pair_weight, f"{key}.pair_weight", 0)
    require_range(c.compress_weight, f"{key}.compress_weight", 0)
    require_range(c.distill_weight, f"{key}.distill_weight", 0)
    require_range(c.distill_temperature, f"{key}.distill_temperature", 0, low_open=True)


def training_config_from_dict(tree: dict) -> TrainingConfig:
    return from_dict(TrainingConfig, tree)
