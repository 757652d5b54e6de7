"""settings.py: a setting's one declaration decides what is accepted, what --help says and how a
refusal is worded (the jobs' own keys: tests/test_config.py)."""

from __future__ import annotations

from dataclasses import field
from typing import Annotated, Literal

import pytest
from pydantic import Field

from distributed_emb.checks import ConfigError
from distributed_emb.settings import Seed, build, key_docs, section


@section
class Inner:
    size: Annotated[int, Field(ge=2, description="rows per step")] = 4
    rate: Annotated[float, Field(gt=0, lt=1, description="a share")] = 0.5
    limit: Annotated[int | None, Field(ge=1, description="stop after")] = None
    workers: Annotated[int | list[int], Field(description="a count or [min, max]")] = 1
    scales: Annotated[list[Annotated[float, Field(gt=0)]], Field(description="C values")] = field(
        default_factory=lambda: [1.0]
    )
    mode: Annotated[Literal["a", "b"], Field(description="how")] = "a"
    gpu: Annotated[bool | Literal["auto"], Field(description="use one")] = "auto"
    path: Annotated[str | None, Field(description="where")] = None
    seed: Annotated[Seed, Field(description="the seed")] = 0


@section
class Outer:
    inner: Inner = field(default_factory=Inner)
    name: Annotated[str, Field(description="a name")] = "x"


def refusal(tree: dict) -> str:
    with pytest.raises(ConfigError) as error:
        build(Outer, tree)
    return str(error.value)


def test_values_within_their_declarations_build_the_sections():
    config = build(
        Outer,
        {"inner": {"size": 2, "rate": 0.25, "workers": [1, 2], "gpu": True, "scales": [0.5]}},
    )
    assert config.inner == Inner(size=2, rate=0.25, workers=[1, 2], gpu=True, scales=[0.5])
    assert config.name == "x"  # a section given in part keeps its other defaults


@pytest.mark.parametrize(
    "tree, message",
    [
        ({"inner": {"size": 1}}, "inner.size: must be >= 2, got 1 — rows per step"),
        ({"inner": {"rate": 1}}, "inner.rate: must be in (0, 1), got 1 — a share"),
        ({"inner": {"limit": 0}}, "inner.limit: must be >= 1 or null, got 0 — stop after"),
        ({"inner": {"seed": -1}}, "inner.seed: must be in [0, 4294967295], got -1 — the seed"),
        ({"inner": {"scales": [1.0, -2.0]}}, "inner.scales[1]: must be > 0, got -2.0 — C values"),
        ({"inner": {"size": "4"}}, "inner.size: expected an integer, got '4'"),
        ({"inner": {"size": 4.0}}, "inner.size: expected an integer, got 4.0"),
        ({"inner": {"size": True}}, "inner.size: expected an integer, got True"),
        ({"inner": {"workers": 1.5}}, "inner.workers: expected an integer or a list of integers"),
        ({"inner": {"mode": "c"}}, "inner.mode: expected one of ['a', 'b'], got 'c'"),
        ({"inner": {"gpu": "yes"}}, "inner.gpu: expected true or false or 'auto', got 'yes'"),
        ({"inner": {"path": 2024}}, "inner.path: expected a string or null, got 2024; quote it"),
        ({"name": None}, "name: expected a string, got null"),
        ({"inner": {"rate": float("nan")}}, "inner.rate: must be a finite number, got nan"),
        ({"inner": 3}, "inner: expected a mapping of its keys, got 3"),
        ({"inner": {"sise": 4}}, "unknown config key 'inner.sise'; known keys: ['gpu', 'limit'"),
        ({"nmae": "y"}, "unknown config key 'nmae'; known keys: ['inner', 'name']"),
    ],
)
def test_a_refused_value_is_named_with_its_declaration(tree, message):
    assert refusal(tree).startswith(message)


def test_an_integer_is_taken_where_a_number_is_declared():
    config = build(Outer, {"inner": {"scales": [2]}})
    assert config.inner.scales == [2.0]
    assert isinstance(config.inner.scales[0], float)


def test_key_docs_read_each_declaration():
    docs = key_docs(Outer)
    assert list(docs) == [f"inner.{name}" for name in Inner.__dataclass_fields__] + ["name"]
    size = docs["inner.size"]
    assert (size.default, size.help, size.kinds, size.bounds) == (
        4,
        "rows per step",
        "an integer",
        ">= 2",
    )
    assert docs["inner.limit"].kinds == "an integer or null"
    assert docs["inner.rate"].bounds == "in (0, 1)"
    assert docs["inner.seed"].bounds == "in [0, 4294967295]"
    assert docs["inner.mode"].kinds == "one of ['a', 'b']"
    assert docs["inner.scales"].kinds == "a list of numbers"
    assert docs["inner.scales"].bounds == "> 0"


@pytest.mark.parametrize(
    "module, name",
    [
        ("distributed_emb.config", "TrainingConfig"),
        ("distributed_emb.mcr2.compression_config", "MCR2Config"),
        ("distributed_emb.infocse.rounds_config", "InfoCSEConfig"),
        ("distributed_emb.infocse.compare", "ComparisonConfig"),
        ("distributed_emb.tune.search_config", "SearchJobConfig"),
        ("distributed_emb.evaluation.suite", "EvaluationConfig"),
    ],
)
def test_every_key_of_every_job_is_declared_with_its_help(module, name):
    """--help shows each key's meaning: a setting without a description is a declaration
    missing its help; a nested plain dataclass (not a @section) would accept unknown keys."""
    import dataclasses
    import importlib
    import typing

    cls = getattr(importlib.import_module(module), name)
    docs = key_docs(cls)
    assert len(docs) > 20
    assert [key for key, doc in docs.items() if not doc.help] == []

    def sections(section_class: type):
        yield section_class
        for hint in typing.get_type_hints(section_class).values():
            if dataclasses.is_dataclass(hint):
                yield from sections(hint)

    for section_class in sections(cls):
        config = getattr(section_class, "__pydantic_config__", {})
        assert config.get("extra") == "forbid", f"{section_class.__name__} is not a @section"


def test_a_partly_overridden_section_keeps_the_jobs_own_defaults():
    """One key of a section given: the rest are the job's defaults (its default_factory), not
    the section class's. MCR²'s loss section sets distill_weight 10 and InfoCSE's output.dir is
    its own; both used to fall back to the class's value when another key was overridden."""
    from distributed_emb.config import load_config
    from distributed_emb.infocse.rounds_config import InfoCSEConfig
    from distributed_emb.mcr2.compression_config import MCR2Config

    mcr2 = load_config(MCR2Config, None, ["loss.pair_weight=0"])
    assert (
        mcr2.loss.pair_weight == 0 and mcr2.loss.distill_weight == MCR2Config().loss.distill_weight
    )
    assert MCR2Config().loss.distill_weight > 0  # the case is real
    infocse = load_config(InfoCSEConfig, None, ["output.resume=overwrite"])
    assert infocse.output.dir == InfoCSEConfig().output.dir == "outputs/infocse"
