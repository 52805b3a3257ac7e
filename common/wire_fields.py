"""Field checking for the wire messages in `common.messages`.

Constraints are attached to message fields with `typing.Annotated` and compiled once per message
class into one checker per field; every failure is a `MessageError` (a `ValueError`) naming the field.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Callable
from dataclasses import fields
from typing import Annotated, Any, Union

_INT_MIN, _UINT64_MAX = -(2**63), 2**64 - 1  # what msgpack can carry
ROLES = ("prefill", "decode", "mixed")
FINISH_REASONS = ("stop", "length", "abort")
# What a worker may report in TokenOutput.timings (the router adds "router_queue" and "decode").
TIMING_STAGES = ("prefill_queue", "prefill", "transfer", "decode_admission")
EVENT_FIELDS = {"stored": {"kind", "hashes", "parent"}, "removed": {"kind", "hashes"}, "cleared": {"kind"}}


class MessageError(ValueError):
    """A message that cannot be encoded or decoded; the text names the offending field."""


# Field constraints, attached with typing.Annotated and checked on construction. On a list, _min applies
# to each element while non_empty is about the list itself.
def at_least(low: int) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        if (
            isinstance(value, list)
            and value
            and min(value) < low
            or not isinstance(value, list)
            and value < low
        ):
            raise MessageError(f"{name} must be >= {low}")

    return check


def non_empty(name: str, value: Any) -> None:
    if not value:
        raise MessageError(f"{name} must not be empty")


def one_of(*choices: str) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        if value is not None and value not in choices:
            raise MessageError(f"{name} must be one of {choices}, got {value!r}")

    return check


Id = Annotated[str, non_empty]
Count = Annotated[int, at_least(0)]
Positive = Annotated[int, at_least(1)]
Hash = Annotated[int, at_least(0)]  # uint64: the upper bound is msgpack's own
Hashes = Annotated[list[int], at_least(0)]
TokenIds = Annotated[list[int], at_least(0)]
Prompt = Annotated[list[int], at_least(0), non_empty]


Checker = Callable[[Any, str], Any]  # (value, field name) -> value, floats widened; or MessageError
_FIELD_CHECKERS: dict[type, list[tuple[str, Checker]]] = {}


def field_checkers(cls: type) -> list[tuple[str, Checker]]:
    """Per message class, one compiled checker per field (built once: messages are on the hot path)."""
    if cls not in _FIELD_CHECKERS:
        hints = typing.get_type_hints(cls, include_extras=True)
        _FIELD_CHECKERS[cls] = [(f.name, _compile(hints[f.name])) for f in fields(cls)]
    return _FIELD_CHECKERS[cls]


_SCALARS: dict[type, Callable[[Any], bool]] = {
    # exact types: bool is not an int here, and numpy scalars must be converted (.tolist()) by the sender
    int: lambda v: type(v) is int and _INT_MIN <= v <= _UINT64_MAX,
    float: lambda v: type(v) in (int, float),
    str: lambda v: type(v) is str,
    bool: lambda v: type(v) is bool,
    dict: lambda v: type(v) is dict and all(type(k) is str for k in v),
    list: lambda v: type(v) is list,
}


def _compile(tp: Any) -> Checker:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        return _annotated(_compile(args[0]), args[1:])
    if origin in (Union, types.UnionType):  # always `X | None` in this module
        inner = _compile(args[0])
        return lambda value, name: None if value is None else inner(value, name)
    if origin is list and args == (int,):
        return _int_list
    if origin is list:
        element = _compile(args[0])
        return lambda value, name: [element(v, name) for v in _scalar(list, value, name)]
    return lambda value, name: _scalar(origin or tp, value, name)


def _annotated(inner: Checker, constraints: tuple) -> Checker:
    def check(value: Any, name: str) -> Any:
        value = inner(value, name)
        for constraint in constraints:
            constraint(name, value)
        return value

    return check


def _scalar(tp: type, value: Any, name: str) -> Any:
    if not _SCALARS[tp](value):
        raise MessageError(f"{name} must be a {tp.__name__}, got {type(value).__name__}")
    return float(value) if tp is float else value


def _int_list(value: Any, name: str) -> list[int]:
    """Token ids and hashes: long lists, so the element checks run in C (map/set/min/max)."""
    if type(value) is not list or not set(map(type, value)) <= {int}:
        raise MessageError(f"{name} must be a list of ints")
    if value and (min(value) < _INT_MIN or max(value) > _UINT64_MAX):
        raise MessageError(f"{name} holds an int msgpack cannot carry")
    return value


_check_hashes, _check_parent = _compile(Hashes), _compile(Hash | None)
_check_int, _check_float, _check_list = _compile(int), _compile(float), _compile(list)


def check_event(event: dict, name: str) -> None:
    kind = event.get("kind")
    if kind not in EVENT_FIELDS:
        raise MessageError(f"{name}.kind must be one of {tuple(EVENT_FIELDS)}, got {kind!r}")
    if set(event) != EVENT_FIELDS[kind]:
        raise MessageError(f"{name} ({kind}) must have exactly the fields {sorted(EVENT_FIELDS[kind])}")
    if kind != "cleared":
        _check_hashes(event["hashes"], f"{name}.hashes")
    if kind == "stored":
        _check_parent(event["parent"], f"{name}.parent")


def check_logprobs(entries: list, num_tokens: int) -> None:
    if len(entries) != num_tokens:
        raise MessageError(f"logprobs must have one entry per token ({num_tokens}), got {len(entries)}")
    for entry in entries:
        if not isinstance(entry, dict) or set(entry) != {"logprob", "top"}:
            raise MessageError('logprobs entries must be {"logprob": float, "top": [[id, logprob], ...]}')
        _check_float(entry["logprob"], "logprobs.logprob")
        for pair in _check_list(entry["top"], "logprobs.top"):
            if not isinstance(pair, list) or len(pair) != 2:
                raise MessageError("logprobs.top entries must be [token_id, logprob] pairs")
            _check_int(pair[0], "logprobs.top.token_id")
            _check_float(pair[1], "logprobs.top.logprob")


def check_timings(timings: dict) -> None:
    """Stage name -> seconds: names from TIMING_STAGES, finite non-negative numbers."""
    for stage, seconds in timings.items():
        if stage not in TIMING_STAGES:
            raise MessageError(f"timings keys must be among {TIMING_STAGES}, got {stage!r}")
        value = _check_float(seconds, f"timings[{stage!r}]")
        if not (math.isfinite(value) and value >= 0):
            raise MessageError(f"timings[{stage!r}] must be a finite number >= 0, got {seconds!r}")
        timings[stage] = value
