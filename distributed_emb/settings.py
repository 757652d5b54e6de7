"""Each setting declared once, and validated by pydantic.

A config section is a standard dataclass made with `@section`; each field is one declaration
of a setting's type, default, allowed range and help text:

    batch_size: Annotated[int, Field(ge=2, description="rows per worker per step")] = 32

Pydantic validates a whole tree of sections (a YAML file merged with overrides) against these
declarations, strictly: a string is never read as a number, a float never as an integer. The
same declarations, read through pydantic's JSON schema, give `--help` (each key's default,
range and meaning) and the wording of every error: the key, the allowed values and the value
given (`train.batch_size: must be >= 2, got 1 — rows per worker per step`).

Why pydantic and standard dataclasses (docs/ARCHITECTURE.md, "Each setting declared once"):
the sections stay plain dataclasses that the code builds, copies and pickles to Ray workers as
before, while pydantic checks types, unions (`int | list[int]`, `bool | "auto"`), literals and
ranges from the annotations alone.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

from distributed_emb.checks import MAX_SEED, ConfigError

T = TypeVar("T")

# Unknown keys are errors; no value is converted to another type (YAML's `"3"` stays a string
# and is refused for a number), except an integer where a float is declared.
_SECTION_CONFIG = ConfigDict(extra="forbid", strict=True)

Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]  # numpy's and Ray Data's largest seed


def section(cls: type[T]) -> type[T]:
    """A config section: a dataclass whose fields pydantic validates strictly, and which
    `freeze` can close once a run has resolved it."""
    cls = dataclass(cls)
    cls.__pydantic_config__ = _SECTION_CONFIG  # read by pydantic for standard dataclasses
    cls.__setattr__ = _refuse_when_frozen
    return cls


class FrozenSettingsError(AttributeError):
    """A resolved run's settings changed: resolve a copy (`dataclasses.replace`) instead."""


def _refuse_when_frozen(self, name: str, value: Any) -> None:
    if self.__dict__.get(_FROZEN):
        raise FrozenSettingsError(
            f"{type(self).__name__}.{name}: the run's settings are resolved and frozen; "
            "change a copy (dataclasses.replace) before resolving"
        )
    object.__setattr__(self, name, value)


_FROZEN = "_frozen_settings"


def freeze(config: T) -> T:
    """Close `config` and every section under it to assignment; returns it. A frozen tree
    pickles and deep-copies frozen; `dataclasses.replace` gives an open copy. Why not frozen
    dataclasses: the loader and the jobs build a config in steps before a run resolves it;
    after that one step (train/resolved_run.py) nothing may change what the run uses."""
    for item in dataclasses.fields(config):
        value = getattr(config, item.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            freeze(value)
    object.__setattr__(config, _FROZEN, True)
    return config


def is_frozen(config: Any) -> bool:
    return bool(getattr(config, "__dict__", {}).get(_FROZEN))


@functools.cache
def _adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)


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


def build(cls: type[T], tree: dict) -> T:
    """The sections of `cls` from a nested mapping of values; ConfigError names the first key
    whose value its declaration refuses."""
    for key, value in flatten(tree).items():
        _require_plain(value, key)
    tree = with_parent_defaults(tree, cls())
    try:
        return _adapter(cls).validate_json(json.dumps(tree))
    except ValidationError as error:
        raise ConfigError(_describe(cls, tree, error)) from None


def with_parent_defaults(given: dict, defaults: Any) -> dict:
    """`given` (a section's mapping) completed with the values of `defaults` (the section as
    its parent builds it) wherever those differ from the section class's own defaults.

    Why: pydantic builds a partly given section from its class's defaults, not from the
    parent's `default_factory`. A job whose section differs from the class (MCR²'s loss with
    distill_weight 10, InfoCSE's output.dir) then lost those values as soon as one key of the
    section was overridden (`loss.pair_weight=0` also turned the distillation off).
    """
    plain = type(defaults)()
    merged = dict(given)
    for f in dataclasses.fields(defaults):
        value = getattr(defaults, f.name)
        if dataclasses.is_dataclass(value):
            sub = given.get(f.name, {})
            if isinstance(sub, dict):  # a null or wrong value stays for pydantic to judge
                filled = with_parent_defaults(sub, value)
                if filled or f.name in given:
                    merged[f.name] = filled
        elif f.name not in given and value != getattr(plain, f.name):
            merged[f.name] = value
    return merged


def _require_plain(value: Any, key: str) -> None:
    """Values JSON can carry, finite: YAML's .nan/.inf would slip past every range (NaN
    compares false with each bound); its dates and other tags are not settings."""
    if isinstance(value, list):
        for index, item in enumerate(value):
            _require_plain(item, f"{key}[{index}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}: must be a finite number, got {value!r}")
    elif value is not None and not isinstance(value, (bool, int, float, str, dict)):
        raise ConfigError(f"{key}: {value!r} is not a setting's value; quote it in YAML")


# ---------------------------------------------------------------------------------------------
# Reading the declarations: --help and the error messages
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyDoc:
    """One setting as declared: its dotted key, built-in default, help and allowed values."""

    key: str
    default: Any
    help: str
    kinds: str  # "an integer or null", "one of ['mean', 'cls']"
    bounds: str  # ">= 2", "in (0, 1)", or ""
    # "str" (a path, a name) or "choice" (one of some strings) when the value is text; None
    # for any other kind, or several. An override of a text key is taken as written.
    text: Literal["str", "choice"] | None
    nullable: bool


@functools.cache
def key_docs(cls: type) -> dict[str, KeyDoc]:
    """Every leaf setting of `cls`, in declaration order, from pydantic's JSON schema."""
    schema = _adapter(cls).json_schema()
    docs: dict[str, KeyDoc] = {}
    # Defaults from an instance: a schema shows neither a factory's value nor a section
    # default that a subclass overrides (InfoCSE's output.dir).
    _collect(schema, schema.get("$defs", {}), dataclasses.asdict(cls()), "", docs)
    return docs


def section_keys(cls: type, dotted: str) -> list[str]:
    """The keys of the section `dotted` names ("" for the top level)."""
    prefix = f"{dotted}." if dotted else ""
    return sorted(
        {key[len(prefix) :].split(".")[0] for key in key_docs(cls) if key.startswith(prefix)}
    )


def _collect(
    schema: dict, defs: dict, defaults: dict, prefix: str, docs: dict[str, KeyDoc]
) -> None:
    for name, prop in schema.get("properties", {}).items():
        key = f"{prefix}{name}"
        nested = _section_schema(prop, defs)
        if nested is not None:
            _collect(nested, defs, defaults[name], f"{key}.", docs)
            continue
        options = prop.get("anyOf", [prop])
        values = [option for option in options if option.get("type") != "null"]
        docs[key] = KeyDoc(
            key=key,
            default=defaults[name],
            help=prop.get("description", ""),
            kinds=" or ".join(dict.fromkeys(_kind(option) for option in options)),
            bounds=next(filter(None, (_bounds(option) for option in options)), ""),
            text=_text(values[0]) if len(values) == 1 else None,
            nullable=len(values) < len(options),
        )


def _section_schema(prop: dict, defs: dict) -> dict | None:
    ref = prop.get("$ref") or next((p["$ref"] for p in prop.get("allOf", []) if "$ref" in p), None)
    if ref is None:
        return None
    target = defs[ref.rsplit("/", 1)[-1]]
    return target if "properties" in target else None


_KINDS = {
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "string": "a string",
    "null": "null",
    "object": "a mapping",
}


def _text(option: dict) -> Literal["str", "choice"] | None:
    if option.get("type") != "string":
        return None
    return "choice" if "enum" in option or "const" in option else "str"


def _kind(option: dict) -> str:
    if "enum" in option:
        return f"one of {option['enum']}"
    if "const" in option:
        return repr(option["const"])
    if option.get("type") == "array":
        item = _kind(option.get("items", {}))
        if item.startswith("one of "):
            return f"a list of items from {item.removeprefix('one of ')}"
        return f"a list of {item.removeprefix('an ').removeprefix('a ')}s"
    if "$ref" in option:
        return "a mapping"
    return _KINDS.get(option.get("type", ""), "any value")


def _bounds(option: dict) -> str:
    if option.get("type") == "array":
        return _bounds(option.get("items", {}))  # each item's
    low = ("(", option["exclusiveMinimum"]) if "exclusiveMinimum" in option else None
    low = low or (("[", option["minimum"]) if "minimum" in option else None)
    high = (")", option["exclusiveMaximum"]) if "exclusiveMaximum" in option else None
    high = high or (("]", option["maximum"]) if "maximum" in option else None)
    if low and high:
        return f"in {low[0]}{low[1]}, {high[1]}{high[0]}"
    if low:
        return f"{'>' if low[0] == '(' else '>='} {low[1]}"
    if high:
        return f"{'<' if high[0] == ')' else '<='} {high[1]}"
    return ""


_RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


def _describe(cls: type, tree: dict, error: ValidationError) -> str:
    """The first refused key's message, in the words of its declaration."""
    docs = key_docs(cls)
    first = error.errors()[0]
    key = _key_of(cls, first["loc"])
    value = lookup(tree, key)[1]
    item = _list_index(first["loc"])
    if item is not None and first["type"] in _RANGE_ERRORS and isinstance(value, list):
        key, value = f"{key}[{item}]", value[item]  # one item of a list setting is refused
    shown = "null" if value is None else repr(value)
    if first["type"] == "unexpected_keyword_argument":
        section_key = key.rpartition(".")[0]
        return f"unknown config key {key!r}; known keys: {section_keys(cls, section_key)}"
    if first["type"] == "missing":
        return f"{key}: is required"
    doc = docs.get(key.split("[")[0])
    if doc is None:  # a whole section given as something else than a mapping
        return f"{key}: expected a mapping of its keys, got {shown}"
    about = f" — {doc.help}" if doc.help else ""
    if first["type"] in _RANGE_ERRORS:
        null = " or null" if doc.nullable else ""
        return f"{key}: must be {doc.bounds}{null}, got {shown}{about}"
    message = f"{key}: expected {doc.kinds}, got {shown}"
    if "a string" in doc.kinds and not isinstance(value, str) and value is not None:
        message += f"; quote it in YAML ('{value}')"
    return message


def _key_of(cls: type, loc: tuple) -> str:
    """The dotted setting an error's location names: its section and field names, without the
    union member and list index pydantic adds after them."""
    parts = []
    current: Any = cls
    for part in loc:
        if not (isinstance(part, str) and dataclasses.is_dataclass(current)):
            break
        parts.append(part)  # a field of this section, or an unknown key as given
        current = _section_type(current, part)
    return ".".join(parts)


def _list_index(loc: tuple) -> int | None:
    """The list index in an error's location (the refused item of a list setting)."""
    return next((part for part in loc if isinstance(part, int)), None)


def _section_type(cls: type, name: str) -> type | None:
    """The section a field of `cls` holds; None for a setting or an unknown name."""
    hint = typing.get_type_hints(cls).get(name)
    return hint if dataclasses.is_dataclass(hint) else None
