"""The settings loader, and the training job's composition of the sections.

Each section is declared beside the package that reads it (distributed_emb/settings.py: each
setting once, with its type, default, range and help): `data/data_config.py`,
`losses/loss_config.py`, `model/model_config.py`, `model/export_config.py`,
`train/train_config.py`, `train/output_config.py`, `evaluation/eval_config.py`,
`ray_config.py`, `logging_config.py`. This module reads YAML plus dotted `key=value` overrides
into a job's config class (old keys moved or refused with their new name), and composes
`TrainingConfig` from the sections with the checks that read more than one of them.

Everything is validated here, before Ray starts: unknown keys, wrong types and impossible
values raise `ConfigError` naming the dotted key, so a typo costs seconds, not a cluster job.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from distributed_emb.checks import ConfigError, require_range
from distributed_emb.checks import require as _require
from distributed_emb.data.data_config import DataConfig, validate_negative_column
from distributed_emb.data.documents import DocumentsConfig, no_documents
from distributed_emb.data.held_out import HeldOutConfig
from distributed_emb.data.sources import require_sources
from distributed_emb.data.stream_settings import StreamSettings
from distributed_emb.evaluation.eval_config import EvalConfig, validate_selection
from distributed_emb.logging_config import LoggingConfig
from distributed_emb.losses.loss_config import LossConfig
from distributed_emb.losses.terms import require_a_weighted_term
from distributed_emb.model.export_config import ExportConfig, validate_export_config
from distributed_emb.model.model_config import ModelConfig, require_model_dir
from distributed_emb.ray_config import RayConfig, validate_ray_config
from distributed_emb.settings import build, flatten, key_docs, lookup, section
from distributed_emb.train.output_config import OutputConfig
from distributed_emb.train.train_config import TrainLoopConfig, validate_worker_counts

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
    "train.checkpoint_steps": (
        "train.report_steps",
        "every report evaluates STS-B dev as well as writing a checkpoint",
    ),
}
# Keys that were removed: they fail with why, never silently.
ONE_DATA_PATH = (
    "every corpus is now read once into indexed token shards (data.token_cache_dir, reused by "
    "later runs with the same corpus and tokenizer) and each worker reads its own rows of them "
    "(docs/ARCHITECTURE.md)"
)
REMOVED_KEYS = {
    "data.token_cache": f"there is nothing to switch off: {ONE_DATA_PATH}; delete the key",
    "data.tokenize_in": (
        f"the shards' build tokenises every corpus in Ray Data tasks: {ONE_DATA_PATH}; "
        "delete the key"
    ),
    "data.shuffle_buffer_rows": (
        "an epoch permutes spans of the whole corpus and shuffles rows within windows "
        "(data/shuffle.py), the same for any number of workers: there is no buffer to size; "
        "data.shuffle_seed sets the order"
    ),
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
_QUOTED_EMPTY = ("''", '""')


def parse_override(text: str, cls: type | None = None) -> tuple[str, Any]:
    """`loss.reconstruction_weight=0.4` → ("loss.reconstruction_weight", 0.4) (YAML-typed).

    Given the config class, a key whose field is text (paths, names, choices) keeps the text
    after `=` literally: YAML would turn `output.dir=/x #1` into "/x" (a comment) and
    `data.path=2024` into an integer. Only null (or nothing) means None, where None is allowed;
    `''` or `""` is the empty text (`"prompts.query=''"` on a shell: no prompt).
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
        if raw.strip() in _QUOTED_EMPTY:  # the empty text, as YAML writes it (a prompt of none)
            return key, ""
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


# ---------------------------------------------------------------------------------------------
# The training configuration (InforMin-CL; InfoCSE pair training reuses it)
# ---------------------------------------------------------------------------------------------


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
    # A training run on documents (train/document_corpus.py): it trains on the sentences of
    # all but the held-out documents and is chosen and reported on the held-out ones.
    documents: DocumentsConfig = field(default_factory=no_documents)
    heldout: HeldOutConfig = field(default_factory=HeldOutConfig)

    def validate(self) -> None:
        m, d, lo, t, e, o = self.model, self.data, self.loss, self.train, self.eval, self.output
        require_model_dir(m.path, "model.path")
        if d.path is not None:
            require_sources([d.path], "data.path")
        if self.documents.paths:
            require_sources(self.documents.paths, "documents.paths")
            _require(
                d.path is None,
                "data.path",
                "and documents.paths both name a training corpus: give one (documents.paths "
                "trains on the documents' sentences, the held-out documents chosen on)",
            )
        require_a_weighted_term(lo)  # losses/terms.py: every term of the objective
        validate_negative_column(d, lo.contrastive_weight)
        if m.compression_head is not None:
            # The head's directory and the pooler it read: the training job's checks
            # (train/driver.py check_compression_head), once files may be read.
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
        e.select_by = validate_selection(e, self.builds_documents())
        _require(bool(o.dir.strip()), "output.dir", "is empty")
        validate_ray_config(self.ray)
        validate_export_config(self.export)

    def builds_documents(self) -> bool:
        """Does the run write its own eval.documents_dir from held-out documents (a run on
        documents.paths, InfoCSE's rounds)? Then eval.select_by=documents:dev is checked
        against that set, and is what eval.select_by=auto means."""
        return bool(self.documents.paths) and self.heldout.fraction > 0

    @property
    def model_path(self) -> str:
        """The encoder to start from, as a directory this process can open."""
        return self.model.local_path()

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
            (self.eval, "documents_dir"),
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


def training_config_from_dict(tree: dict) -> TrainingConfig:
    return from_dict(TrainingConfig, tree)
