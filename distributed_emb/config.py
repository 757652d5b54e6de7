"""Configuration as data: the settings' sections (each setting declared once, with its type,
default, range and help: distributed_emb/settings.py), loaded from YAML plus dotted `key=value`
overrides.

Everything is validated here, before Ray starts: unknown keys, wrong types and impossible
values raise `ConfigError` naming the dotted key, so a typo costs seconds, not a cluster job.
`validate()` of a config keeps only the checks that read more than one setting, or the disk.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import re
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import Field

from distributed_emb.checks import (  # noqa: F401 - re-exported: every section's checks
    MAX_SEED,
    ConfigError,
    require_range,
)
from distributed_emb.checks import require as _require
from distributed_emb.data.data_config import DataConfig
from distributed_emb.data.sources import is_hub_name, is_remote
from distributed_emb.data.stream_settings import StreamSettings
from distributed_emb.losses.loss_config import LossConfig
from distributed_emb.paths import default_model_path
from distributed_emb.settings import (
    Seed,
    build,
    flatten,
    key_docs,
    lookup,
    section,
)

T = TypeVar("T")


# ---------------------------------------------------------------------------------------------
# Generic loading
# ---------------------------------------------------------------------------------------------


class _YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading `3e-5` as the number it plainly is: YAML 1.1, which PyYAML
    follows, reads a float without a dot as a string."""


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."),
)


def read_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_YamlLoader)  # noqa: S506 - a safe loader


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


log = logging.getLogger("distributed_emb")

# Keys that moved to the one vocabulary (a concept has one key in every job): a config class
# lists its own in `KEY_ALIASES` (old → new; a key ending in "." moves a whole section, "" is the
# top level). The old key still works for now, with a warning naming the new one.


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
        if not old.endswith(".") and isinstance(node[path[-1]], dict):
            continue  # a key that became a section (evaluate's `model`), given as the section
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


def _build(cls: type[T], tree: dict) -> T:
    """`cls` from a nested mapping: a renamed or removed key fails saying so; the rest is the
    declarations' (settings.build)."""
    for dotted, (new, why) in RENAMED_KEYS.items():
        if lookup(tree, dotted)[0]:
            raise ConfigError(f"{dotted} is now {new} ({why})")
    for dotted, why in REMOVED_KEYS.items():
        if lookup(tree, dotted)[0]:
            raise ConfigError(f"{dotted} was removed: {why}")
    return build(cls, tree)


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
    doc = None
    if cls is not None:
        key = current_key(cls, key)
        doc = key_docs(cls).get(key)
    if doc is not None and doc.text is not None:
        if doc.nullable and raw.strip() in _YAML_NULLS:
            return key, None
        # A path keeps every character; a choice (pooler=mean) never has outer blanks.
        return key, raw if doc.text == "str" else raw.strip()
    try:
        value = read_yaml(raw) if raw.strip() else None
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
            loaded = read_yaml(path.read_text())
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
    """The object store of a Ray started here (ignored when joining a cluster) cannot exceed
    this machine's memory; a value in bytes instead of MiB is the usual way to get there. Its
    lower bound is declared."""
    memory = _physical_memory_mb()
    if memory is not None and ray.object_store_memory_mb is not None:
        require_range(
            ray.object_store_memory_mb,
            f"{prefix}.object_store_memory_mb",
            MIN_OBJECT_STORE_MB,
            memory,
            why=f"MiB, at most this machine's {memory} MiB of memory; null lets Ray choose",
        )


# ---------------------------------------------------------------------------------------------
# The training configuration (InforMin-CL; InfoCSE pair training reuses it)
# ---------------------------------------------------------------------------------------------


@section
class ModelConfig:
    path: Annotated[
        str | None,
        Field(
            description="the encoder to start from: a Hugging Face or sentence-transformers "
            "directory (local or s3://), or a hub name; null: the packaged all-MiniLM-L6-v2"
        ),
    ] = None
    pooler: Annotated[
        Literal["cls", "cls_before_pooler", "mean"],
        Field(
            description="the sentence vector: mean of tokens, [CLS] through the pooler, or raw "
            "[CLS]"
        ),
    ] = "mean"
    mlp_head: Annotated[
        Literal["train_only", "export", "none"],
        Field(
            description="SimCSE's MLP (dense + tanh) over the pooled vector: during training "
            "only, also exported, or not at all"
        ),
    ] = "train_only"
    max_seq_length: Annotated[
        int, Field(ge=4, description="tokens per sentence in training (longer ones are cut)")
    ] = 32
    trust_remote_code: Annotated[
        bool, Field(description="allow a model directory's own Python code (custom models)")
    ] = False
    compression_head: Annotated[
        str | None,
        Field(
            description="an MCR² compression head (a models/mcr2-<dim> directory of "
            "jobs/train_mcr2.py) to fine-tune end to end with the encoder; the encoder's "
            "vectors pass through it in training, selection and the export"
        ),
    ] = None


@section
class DeepSpeedConfig:
    zero_stage: Annotated[int, Field(ge=0, le=3, description="DeepSpeed ZeRO stage")] = 2
    config_path: Annotated[
        str | None, Field(description="a DeepSpeed JSON whose keys override ours")
    ] = None
    # DeepSpeed checkpoints are pickles: by default they are restored with
    # torch.load(weights_only=True) and a short allowlist of plain-data DeepSpeed classes.
    trust_checkpoints: Annotated[
        bool,
        Field(
            description="restore DeepSpeed checkpoints with full unpickling (can run code): "
            "only for checkpoints you wrote yourself"
        ),
    ] = False


@section
class TrainLoopConfig:
    # Ray Train's elastic worker groups. The global batch G stays `batch_size × max` whatever the
    # group's size W, which need not divide it: the first G % W workers take ⌈G/W⌉ rows, the
    # others ⌊G/W⌋ (data/global_batches.py split_rows), and the loss is weighted so training
    # equals one process on all G rows (train/step.py rank_weight). A worker's memory is bounded
    # by the ⌈G/min⌉ rows it holds in the smallest group; GradCache (train.mini_batch_size) caps
    # the activation memory at one mini-batch's whatever the slice (only the (B, d) cached
    # embeddings and the (B, G) logits grow with it).
    num_workers: Annotated[
        int | list[int],
        Field(
            description="Ray Train workers (one per GPU), or [min, max] for an elastic group "
            "that starts once min fit, grows as nodes arrive and shrinks when one is lost"
        ),
    ] = 2
    elastic_resize_interval_s: Annotated[
        float,
        Field(
            gt=0,
            description="how often an elastic group checks whether more workers fit; growing "
            "restarts the group from its last checkpoint",
        ),
    ] = 60.0
    use_gpu: Annotated[bool, Field(description="one GPU per worker")] = False
    cpus_per_worker: Annotated[float, Field(gt=0, description="CPUs each worker reserves")] = 1.0
    engine: Annotated[
        Literal["ddp", "deepspeed"],
        Field(description="DDP, or DeepSpeed ZeRO (pip install -e '.[deepspeed]')"),
    ] = "ddp"
    # train/precision.py; the losses stay fp32.
    precision: Annotated[
        Literal["auto", "fp32", "bf16", "fp16"],
        Field(
            description="training precision (fp16 only on GPUs); auto: bf16 autocast where it "
            "is faster (GPUs with bf16, CPUs that measure faster at start-up), else fp32"
        ),
    ] = "fp32"
    # train/layout.py.
    layout: Annotated[
        Literal["auto", "as_set"],
        Field(
            description="how the global batch is laid out over processes: as_set, exactly "
            "num_workers × batch_size; auto (one node): one worker holding the whole global "
            "batch with every core on a CPU node, one worker per GPU on a GPU node"
        ),
    ] = "as_set"
    # On a 2-core CPU it measured 0.97x eager after 50-100 s of compiling (docs/BENCHMARKS.md);
    # the gain it exists for is on GPUs (bench/gpu_check.sh measures it). Batches are padded to
    # a multiple of 8 tokens so the compiled graph meets few shapes.
    compile: Annotated[
        bool,
        Field(
            description="torch.compile the encoder: faster steps on GPUs, after minutes of "
            "compiling"
        ),
    ] = False
    batch_size: Annotated[
        int,
        Field(
            ge=2,
            description="rows per worker per step (at the largest group; in-batch negatives: "
            "the global batch is num_workers × this)",
        ),
    ] = 32
    mini_batch_size: Annotated[
        int | None,
        Field(
            ge=1,
            description="GradCache: embed in mini-batches of this size to cap memory, at most "
            "train.batch_size; null: one pass",
        ),
    ] = None
    gradient_accumulation_steps: Annotated[
        int, Field(ge=1, description="batches per optimizer step")
    ] = 1
    learning_rate: Annotated[
        float, Field(gt=0, description="peak AdamW learning rate (linear decay)")
    ] = 3e-5
    weight_decay: Annotated[float, Field(ge=0, description="AdamW weight decay")] = 0.0
    warmup_ratio: Annotated[
        float, Field(ge=0, lt=1, description="share of the steps with a linear warm-up")
    ] = 0.0
    min_learning_rate_ratio: Annotated[
        float,
        Field(
            ge=0,
            le=1,
            description="where the linear decay ends, as a share of train.learning_rate "
            "(0: decays to 0; 1: constant after the warm-up)",
        ),
    ] = 0.0
    # clip_grad_norm_ scales gradients by max_norm / norm: a negative bound reverses them
    # (training climbs the loss) and 0 zeroes them.
    max_grad_norm: Annotated[
        float | None, Field(gt=0, description="gradient clipping bound; null: no clipping")
    ] = 1.0
    epochs: Annotated[int, Field(ge=1, description="passes over the corpus")] = 1
    max_steps: Annotated[
        int | None, Field(ge=1, description="stop after this many optimizer steps")
    ] = None
    seed: Annotated[Seed, Field(description="seed of the model, dropout and data order")] = 42
    torch_threads: Annotated[
        int | None,
        Field(ge=1, description="torch threads per worker; null: cpus_per_worker, rounded up"),
    ] = None
    max_failures: Annotated[
        int,
        Field(
            ge=-1,
            description="worker-group restarts from the last checkpoint before the run fails "
            "(-1: unlimited)",
        ),
    ] = 0
    report_steps: Annotated[
        int | None,
        Field(
            ge=1,
            description="also evaluate STS-B dev and write a checkpoint every N steps; null: "
            "only at eval.eval_steps",
        ),
    ] = None
    # The resource plan (resource_plan.py) checks the cluster holds both these and the workers.
    data_cpus: Annotated[
        float,
        Field(
            ge=1,
            description="CPUs kept free of Train workers for Ray Data's read/clean/feed tasks "
            "(whole CPUs: each task takes one)",
        ),
    ] = 1.0
    lower_cpus_to_fit: Annotated[
        bool,
        Field(
            description="when the cluster's CPUs cannot hold the workers plus train.data_cpus, "
            "reserve a smaller CPU share per worker (at least 0.25; torch threads unchanged) "
            "instead of failing"
        ),
    ] = True
    # A pipeline that can never be scheduled, or nodes that never come.
    stall_timeout_s: Annotated[
        float | None,
        Field(
            gt=0,
            description="fail the run when a task, actor or worker group of the job has waited "
            "this long for resources; null: never",
        ),
    ] = 600.0
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


@section
class EvalConfig:
    eval_steps: Annotated[
        int, Field(ge=1, description="evaluate STS-B dev (and checkpoint) every N steps")
    ] = 50
    senteval_dir: Annotated[
        str | None, Field(description="SentEval data directory; null: the shipped STS-B")
    ] = None
    max_pairs: Annotated[
        int | None,
        Field(ge=3, description="evaluate on the first N STS-B dev pairs (quick runs; Spearman)"),
    ] = None
    batch_size: Annotated[int, Field(ge=1, description="sentences per evaluation batch")] = 128
    test_after_training: Annotated[
        bool,
        Field(description="score the exported model on STS-B test (needs it in eval.senteval_dir)"),
    ] = True
    # True for a single run (never ship worse than the start); InfoCSE rounds set False: a
    # round's model is what its training produced, and the rounds compare it with the start.
    start_is_candidate: Annotated[
        bool,
        Field(
            description="may the starting model (step 0) be the one exported when no trained "
            "step beats it"
        ),
    ] = True
    # InfoCSE rounds and the side-by-side arms set False: their start was scored already, and
    # the pass is a whole dev evaluation.
    score_start: Annotated[
        bool, Field(description="score the starting model (step 0) before training")
    ] = True
    # selection.py: what chooses is one reported score (select_score), whichever it is.
    retrieval_dir: Annotated[
        str | None,
        Field(
            description="a BEIR directory (corpus.jsonl, queries.jsonl, qrels/<split>.tsv) "
            "every evaluation also scores: nDCG@10 × 100 of each split but train and test, "
            "as retrieval_<split>_ndcg_at_10; every worker reads it"
        ),
    ] = None
    select_by: Annotated[
        str,
        Field(
            description="what chooses the exported checkpoint (and Tune's best trial): "
            "stsb_dev (STS-B dev Spearman), or retrieval:<split> (nDCG@10 on that split of "
            "eval.retrieval_dir, e.g. retrieval:dev; never test); STS-B dev is reported "
            "either way"
        ),
    ] = "stsb_dev"


@section
class OutputConfig:
    dir: Annotated[
        str,
        Field(description="where model/, metrics.json, run.log and train_log.jsonl go"),
    ] = "outputs/informin"
    checkpoints_to_keep: Annotated[
        int, Field(ge=1, description="Ray Train checkpoints kept (the best by STS-B dev)")
    ] = 2
    storage_path: Annotated[
        str | None,
        Field(
            description="Ray Train storage: s3://, gs:// or a local path; null: under output.dir"
        ),
    ] = None
    run_name: Annotated[
        str | None, Field(description="Ray Train run name (also the trackers' run name)")
    ] = None
    # train/run_identity.py.
    resume: Annotated[
        Literal["auto", "must", "anyway", "overwrite"],
        Field(
            description="an earlier run under the same run name: auto continues it when its "
            "settings match and refuses otherwise; must (--resume) requires one; anyway "
            "(--resume-anyway) continues it with other settings; overwrite (--overwrite) "
            "deletes it and starts again"
        ),
    ] = "auto"
    row_log: Annotated[
        bool,
        Field(
            description="audit trail: each rank appends the row ids of every batch it trains "
            "on to <output.dir>/trained_rows/rank<r>.jsonl"
        ),
    ] = False


@section
class RayConfig:
    address: Annotated[
        str | None,
        Field(description="the Ray cluster to join; null: RAY_ADDRESS if set, else start one here"),
    ] = None
    num_cpus: Annotated[
        int | None,
        Field(ge=1, description="logical CPUs of a Ray started here; null: the machine's cores"),
    ] = None
    # Its upper bound, this machine's memory: validate_ray_config.
    object_store_memory_mb: Annotated[
        int | None,
        Field(
            ge=MIN_OBJECT_STORE_MB,
            description="object store of a Ray started here, in MiB (at least Ray's minimum); "
            "null: Ray chooses",
        ),
    ] = 1024


@section
class LoggingConfig:
    tensorboard: Annotated[
        bool,
        Field(description="event files in <output.dir>/tensorboard/, written by rank 0"),
    ] = True
    wandb: Annotated[
        bool,
        Field(
            description="Weights & Biases through Ray's setup_wandb (needs wandb and an API key)"
        ),
    ] = False
    mlflow: Annotated[
        bool,
        Field(description="MLflow through Ray's setup_mlflow (MLFLOW_TRACKING_URI or a file)"),
    ] = False
    logging_steps: Annotated[
        int,
        Field(
            ge=1,
            description="a progress line (console, run.log, train_log.jsonl, the trackers) "
            "every N steps",
        ),
    ] = 10
    # Redrawn into a log file, each redraw would become a line.
    progress_bar: Annotated[
        Literal["auto", "on", "off"],
        Field(description="the training progress bar; auto: only when stderr is a terminal"),
    ] = "auto"


@section
class ExportConfig:
    # model.max_seq_length is the training length, a speed choice, not what users of the export
    # should get.
    max_seq_length: Annotated[
        int | None,
        Field(ge=4, description="the exported model's max_seq_length; null: the base model's own"),
    ] = None
    push_to_hub: Annotated[
        bool,
        Field(description="upload the export after training (needs HF_HUB_OFFLINE=0 and a token)"),
    ] = False
    hub_model_id: Annotated[
        str | None, Field(description="the hub repository, e.g. my-org/informin-minilm")
    ] = None
    license: Annotated[
        str | None, Field(description="the model card's licence; null: the base model card's")
    ] = None


def validate_export_config(c: ExportConfig, key: str = "export") -> None:
    """The hub id's form, and the hub being reachable at all: a push that can only fail must
    fail here, before hours of training, not after them."""
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


@section
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
        if d.path is not None:
            require_sources([d.path], "data.path")
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
        if lo.distill_weight > 0:  # no teacher named: the starting model (a pull toward it)
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
        if t.mini_batch_size is not None:
            require_range(
                t.mini_batch_size,
                "train.mini_batch_size",
                1,
                t.batch_size,
                why="at most train.batch_size",
            )
        if t.deepspeed.config_path is not None:
            _require(
                Path(t.deepspeed.config_path).is_file(),
                "train.deepspeed.config_path",
                f"{t.deepspeed.config_path} does not exist",
            )
        if t.precision == "fp16":
            _require(t.use_gpu, "train.precision", "fp16 needs a GPU; use bf16 or fp32 on CPU")
        if e.senteval_dir is not None:
            _require(
                Path(e.senteval_dir).is_dir(),
                "eval.senteval_dir",
                f"{e.senteval_dir} is not a directory",
            )
        validate_selection(e)
        _require(bool(o.dir.strip()), "output.dir", "is empty")
        validate_ray_config(self.ray)
        validate_export_config(self.export)

    @property
    def model_path(self) -> str:
        """The encoder to start from, as a directory this process can open (a model on object
        storage is copied to the node once: storage.local_model_dir)."""
        from distributed_emb.storage import local_model_dir

        return local_model_dir(self.model.path or default_model_path())

    def stream_settings(self) -> StreamSettings:
        """What the data path needs from the other sections (data/stream_settings.py)."""
        data, output = self.data, self.output
        if data.token_cache_dir:
            root = data.token_cache_dir
        elif output.storage_path:
            root = f"{output.storage_path.rstrip('/')}/token_cache"
        else:
            root = str(Path(output.dir).resolve() / "ray_results" / "token_cache")
        return StreamSettings(
            tokenizer=self.model_path,
            max_seq_length=self.model.max_seq_length,
            trust_remote_code=self.model.trust_remote_code,
            global_batch=self.train.global_batch,
            max_steps=self.train.max_steps,
            use_gpu=self.train.use_gpu,
            token_cache_root=root if "://" in root else str(Path(root).expanduser().resolve()),
        )

    def make_paths_absolute(self) -> None:
        """output.dir, and model and retrieval directories given relative to this directory,
        made absolute: Ray Train workers run in other working directories (on a cluster, other
        machines; rank 0 writes run.log there, every worker loads the models and reads the
        retrieval data). A hub name, or a path that is not a directory here, stays as given."""
        self.output.dir = str(Path(self.output.dir).expanduser().resolve())
        for holder, key in (
            (self.model, "path"),
            (self.model, "compression_head"),
            (self.loss, "distill_teacher"),
            (self.eval, "retrieval_dir"),
        ):
            value = getattr(holder, key)
            if value is not None and Path(value).expanduser().is_dir():
                setattr(holder, key, str(Path(value).expanduser().resolve()))


def training_sections(config: TrainingConfig) -> TrainingConfig:
    """The TrainingConfig part of a config that extends it (InfoCSE's, a search's): its own
    sections, shared, not copied (copy before changing one for a round or a trial)."""
    return TrainingConfig(
        **{f.name: getattr(config, f.name) for f in dataclasses.fields(TrainingConfig)}
    )


def validate_selection(e: EvalConfig) -> None:
    """eval.select_by names STS-B dev or a split that eval.retrieval_dir holds (not test)."""
    from distributed_emb.selection import check_select_by

    splits = None
    if e.retrieval_dir is not None:
        from distributed_emb.data.beir_layout import BeirDataError, list_splits

        try:
            splits = list_splits(e.retrieval_dir)
        except BeirDataError as error:
            raise ConfigError(f"eval.retrieval_dir: {error}") from None
    check_select_by(e.select_by, e.retrieval_dir, splits)


def validate_worker_counts(t: TrainLoopConfig) -> None:
    """`train.num_workers`: a count, or [min, max]; any size in the range trains the global batch
    (its workers take ⌊G/W⌋ or ⌈G/W⌉ rows: data/global_batches.py split_rows)."""
    if not t.elastic:
        require_range(t.num_workers, "train.num_workers", 1)
        return
    _require(
        len(t.num_workers) == 2 and 1 <= t.num_workers[0] <= t.num_workers[1],
        "train.num_workers",
        f"{list(t.num_workers)}: a range is [min, max] with 1 <= min <= max",
    )


def training_config_from_dict(tree: dict) -> TrainingConfig:
    return from_dict(TrainingConfig, tree)
