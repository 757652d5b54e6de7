"""Search spaces: which TrainingConfig keys a search varies, over what, and how a trial's
sampled values become a validated TrainingConfig.

A space maps dotted TrainingConfig keys to a distribution, in YAML either flat or nested:

    search:
      loss.reconstruction_weight: {type: loguniform, low: 0.04, high: 4}   # λ
      loss:
        mlm_weight: {type: choice, values: [0.0, 0.01, 0.1]}              # β

Types: `loguniform` / `uniform` (low, high), `choice` (values: sampled), `grid` (values: every
one is run, `num_samples` times each). Any mapping holding a `type` key is a distribution; a
key set to null is not searched (the base config's value is used).

Every bound and every listed value is checked against the TrainingConfig before Ray starts
(the key must exist, the type must fit, `validate()` must pass), so a bad space fails in
seconds with the key's name instead of as N failed trials.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Any

from ray import tune as ray_tune

from distributed_emb.checks import ConfigError
from distributed_emb.config import TrainingConfig, from_dict, to_dict

# The space (InforMin-CL's hyperparameters, the ranges the paper grid-searches over).
DEFAULT_SEARCH_SPACE: dict[str, dict] = {
    "loss": {
        "reconstruction_weight": {"type": "loguniform", "low": 0.04, "high": 4.0},  # λ
        "mlm_weight": {"type": "choice", "values": [0.0, 0.01, 0.1]},  # β
    },
    "train": {
        "learning_rate": {"type": "loguniform", "low": 1.0e-5, "high": 5.0e-5},
        "batch_size": {"type": "choice", "values": [64, 128, 256]},  # per worker
    },
}

# Sections whose keys a trial may vary. Not data (the corpus is read once for all trials),
# not eval (it defines the metric trials are compared on), not output/ray (where and how).
SEARCHABLE_SECTIONS = ("model", "loss", "train")
RANGE_TYPES = ("loguniform", "uniform")
LIST_TYPES = ("choice", "grid")


@dataclass(frozen=True)
class Distribution:
    """One searched key: `kind` with (low, high) for ranges, `values` for choice/grid."""

    key: str  # dotted TrainingConfig key, e.g. "loss.reconstruction_weight"
    kind: str  # loguniform | uniform | choice | grid
    low: float | None = None
    high: float | None = None
    values: tuple = ()

    def candidates(self) -> list:
        """The values a trial can get at the edges: bounds for ranges, all values for lists."""
        return [self.low, self.high] if self.kind in RANGE_TYPES else list(self.values)

    def to_ray(self):
        """The ray.tune domain (sampled by the searcher)."""
        if self.kind == "loguniform":
            return ray_tune.loguniform(self.low, self.high)
        if self.kind == "uniform":
            return ray_tune.uniform(self.low, self.high)
        if self.kind == "choice":
            return ray_tune.choice(list(self.values))
        return ray_tune.grid_search(list(self.values))

    def describe(self) -> str:
        if self.kind in RANGE_TYPES:
            return f"{self.kind}({self.low:g}, {self.high:g})"
        return f"{self.kind}{list(self.values)}"


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """Nested or dotted mappings → {dotted key: leaf}, where a leaf holds `type` or is None."""
    flat: dict[str, Any] = {}
    for name, value in tree.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if value is None or (isinstance(value, dict) and "type" in value):
            leaves = {key: value}
        elif isinstance(value, dict):
            leaves = _flatten(value, key)
        else:
            raise ConfigError(
                f"search.{key}: expected a distribution such as "
                f"{{type: choice, values: [...]}}, got {value!r}"
            )
        for leaf_key, leaf in leaves.items():
            if leaf_key in flat:
                raise ConfigError(f"search.{leaf_key}: given twice (dotted and nested)")
            flat[leaf_key] = leaf
    return flat


def _number(spec: dict, field: str, key: str) -> float:
    value = spec.get(field)
    if isinstance(value, str):
        try:  # YAML 1.1 reads 1e-5 (no dot) as a string
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"search.{key}.{field}: expected a number, got {value!r}")
    return float(value)


def _distribution(key: str, spec: dict) -> Distribution:
    kind = spec.get("type")
    if kind in RANGE_TYPES:
        unknown = set(spec) - {"type", "low", "high"}
        if unknown:
            raise ConfigError(f"search.{key}: unknown fields {sorted(unknown)} for {kind}")
        low, high = _number(spec, "low", key), _number(spec, "high", key)
        if not low < high:
            raise ConfigError(f"search.{key}: low ({low:g}) must be below high ({high:g})")
        if kind == "loguniform" and low <= 0:
            raise ConfigError(f"search.{key}: loguniform needs low > 0, got {low:g}")
        return Distribution(key, kind, low=low, high=high)
    if kind in LIST_TYPES:
        unknown = set(spec) - {"type", "values"}
        if unknown:
            raise ConfigError(f"search.{key}: unknown fields {sorted(unknown)} for {kind}")
        values = spec.get("values")
        if not isinstance(values, list) or not values:
            raise ConfigError(f"search.{key}.values: expected a non-empty list, got {values!r}")
        if len(set(map(repr, values))) != len(values):
            raise ConfigError(f"search.{key}.values: repeated values in {values!r}")
        return Distribution(key, kind, values=tuple(values))
    raise ConfigError(f"search.{key}.type: {kind!r} is not one of {list(RANGE_TYPES + LIST_TYPES)}")


def _set_dotted(tree: dict, key: str, value: Any) -> None:
    *sections, name = key.split(".")
    node = tree
    for section in sections:
        node = node[section]
    node[name] = value


def _get_dotted(tree: dict, key: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        node = node[part]
    return node


def _check_key(key: str) -> None:
    """The key must name a value (not a section) of a searchable TrainingConfig section."""
    cls: Any = TrainingConfig
    parts = key.split(".")
    if parts[0] not in SEARCHABLE_SECTIONS:
        raise ConfigError(
            f"search.{key}: only keys of {list(SEARCHABLE_SECTIONS)} can be searched "
            "(the corpus is read once for all trials; eval defines the compared metric)"
        )
    for index, part in enumerate(parts):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if part not in fields:
            where = ".".join(parts[:index]) or "the top level"
            raise ConfigError(
                f"search.{key}: {part!r} is not a config key of {where} (known: {sorted(fields)})"
            )
        hint = typing.get_type_hints(cls)[part]
        if dataclasses.is_dataclass(hint):
            if index == len(parts) - 1:
                raise ConfigError(f"search.{key}: is a section, not a value")
            cls = hint
        elif index != len(parts) - 1:
            raise ConfigError(f"search.{key}: {part!r} is a value, not a section")


def parse_search_space(tree: dict | None, base: TrainingConfig) -> dict[str, Distribution]:
    """A YAML `search:` tree → {dotted key: Distribution}, every candidate value validated
    against `base` (the key exists, the value has the right type, validate() passes)."""
    if not isinstance(tree, dict):
        raise ConfigError(f"search: expected a mapping of config keys, got {tree!r}")
    space: dict[str, Distribution] = {}
    for key, spec in _flatten(tree).items():
        if spec is None:
            continue  # explicitly not searched
        _check_key(key)
        distribution = _distribution(key, spec)
        for value in distribution.candidates():
            apply_params(base, {key: value}, where=f"search.{key}")
        space[key] = distribution
    if not space:
        raise ConfigError("search: no key is searched (every entry is null)")
    return space


def _plain(value: Any) -> Any:
    """numpy scalars (what some searchers hand out) → Python numbers the config accepts."""
    return value.item() if hasattr(value, "item") and not isinstance(value, (list, dict)) else value


def apply_params(
    base: TrainingConfig, params: dict[str, Any], where: str = "trial"
) -> TrainingConfig:
    """`base` with the dotted `params` set, type-checked and validated (a new object)."""
    tree = to_dict(base)
    for key, value in params.items():
        try:
            _get_dotted(tree, key)
        except (KeyError, TypeError):
            raise ConfigError(f"{where}: {key!r} is not a TrainingConfig key") from None
        _set_dotted(tree, key, _plain(value))
    try:
        config = from_dict(TrainingConfig, tree)
        config.validate()
    except ConfigError as error:
        raise ConfigError(f"{where}: {error}") from None
    return config


def param_space(space: dict[str, Distribution]) -> dict[str, Any]:
    """The Tuner's param_space: flat {dotted key: ray.tune domain}."""
    return {key: distribution.to_ray() for key, distribution in space.items()}


def grid_size(space: dict[str, Distribution]) -> int:
    """How many configurations one sample expands to (Tune runs num_samples × this)."""
    return math.prod(len(d.values) for d in space.values() if d.kind == "grid")
