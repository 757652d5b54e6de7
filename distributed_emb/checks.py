"""The checks a config's validate() makes across settings (one setting's own range is in its
declaration: settings.py), below every package that declares settings: a problem is a
ConfigError whose message names the key, the allowed values and the value given."""

from __future__ import annotations

import math
from typing import Any

from distributed_emb.errors import UserInputError


class ConfigError(UserInputError):
    """A configuration problem; the message names the offending key."""


def require(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{key}: {message}")


# Largest seed every consumer takes (numpy's legacy RandomState, Ray Data's local shuffle).
MAX_SEED = 2**32 - 1


def require_range(
    value: Any,
    key: str,
    low: float | None = None,
    high: float | None = None,
    *,
    allow_none: bool = False,
    low_open: bool = False,
    high_open: bool = False,
    why: str = "",
) -> None:
    """`value` within [low, high] (`low_open`/`high_open`: that bound excluded), finite; None
    only with `allow_none`. The one range check of every config: its message names the key,
    the allowed range and the value, e.g. `train.max_grad_norm: must be > 0 or null, got -1.0`.
    """
    if low is not None and high is not None:
        wanted = f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    elif low is not None:
        wanted = f"{'>' if low_open else '>='} {low}"
    elif high is not None:
        wanted = f"{'<' if high_open else '<='} {high}"
    else:
        wanted = "a finite number"
    if allow_none:
        wanted += " or null"
    ok = value is not None or allow_none
    if value is not None:
        ok = (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and (low is None or (value > low if low_open else value >= low))
            and (high is None or (value < high if high_open else value <= high))
        )
    if not ok:
        shown = "null" if value is None else repr(value)
        raise ConfigError(f"{key}: must be {wanted}, got {shown}" + (f" ({why})" if why else ""))
