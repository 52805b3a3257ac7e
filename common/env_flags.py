"""The engine's `PDSERVE_*` environment switches, read and validated in one place.

Each reader returns the default when the variable is unset and raises ValueError naming the variable
when it is set to something it cannot mean, so a typo (`PDSERVE_PDL=yes`, `PDSERVE_SKINNY_MAX_ROWS=0`)
stops the process at start-up instead of silently running the default. Callers that read a switch on a
hot path cache the result themselves (functools.cache), as they did before.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import TypeVar

N = TypeVar("N", int, float)


def env_choice(name: str, choices: Sequence[str], default: str) -> str:
    """One of `choices` (compared as written: `auto`, `0`, `1`...)."""
    value = os.environ.get(name, default)
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def env_switch(name: str, default: bool) -> bool:
    """An on/off switch written `1` or `0`."""
    return env_choice(name, ("0", "1"), "1" if default else "0") == "1"


def env_int(name: str, default: int, low: int, high: int) -> int:
    """An integer in [low, high]."""
    return _env_number(name, default, int, lambda v: low <= v <= high, f"an integer in [{low}, {high}]")


def env_float(name: str, default: float, allow_zero: bool = False) -> float:
    """A finite number above zero (a timeout), or at least zero with `allow_zero` (a size budget)."""

    def ok(value: float) -> bool:
        return math.isfinite(value) and (value >= 0 if allow_zero else value > 0)

    floor = "at least 0" if allow_zero else "above 0"
    return _env_number(name, default, float, ok, f"a finite number {floor}")


def _env_number(name: str, default: N, parse: Callable[[str], N], ok: Callable[[N], bool], what: str) -> N:
    """The variable parsed when set and `ok`, the default when unset, else a ValueError saying `what`."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = parse(raw)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise ValueError(f"{name} must be {what}, got {raw!r}")
    return value
