"""Field checking for the wire messages in `common.wire.messages` and for the typed values they carry.

Constraints are attached to fields with `typing.Annotated` and compiled once per class into one checker
per field; every failure is a `MessageError` (a `ValueError`) naming the field.

Nested values are typed, never loose dicts: a message's `sampling` is a `SamplingParams`, its `events`
are `KVEvent`s, its `logprobs` are `TokenLogprob`s, its `finish_reason` is a `FinishReason`. A nested
dataclass (a "record") travels as a msgpack map of its fields (`wire_form`); one with a `KIND` class
variable also carries it as "kind", which is how the members of a union are told apart. Decoding a map
checks its keys and each field's type, then builds the value, whose own constructor checks the rest
(e.g. SamplingParams' ranges). A record handed to a message's constructor is checked field by field the
same way, so a bad value fails where the message is built. Enums travel as their values. What
msgpack can carry, and the one-pass tests of long lists, are in `common.wire.msgpack_values`.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal, Union

from common.wire.msgpack_values import BULK_CHECKS, INT_MIN, SCALARS, UINT64_MAX, only_type


class MessageError(ValueError):
    """A message that cannot be encoded or decoded; the text names the offending field.

    `request_id` is set by `common.wire.messages.decode` when a malformed request still names its request."""

    request_id: str | None = None


# Field constraints, attached with typing.Annotated and checked on construction. On a list or tuple,
# at_least applies to each element while non_empty is about the sequence itself.
def at_least(low: int) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        if isinstance(value, list | tuple):
            if value and min(value) < low:
                raise MessageError(f"{name} must be >= {low}")
        elif value < low:
            raise MessageError(f"{name} must be >= {low}")

    return check


def non_empty(name: str, value: Any) -> None:
    if not value:
        raise MessageError(f"{name} must not be empty")


Id = Annotated[str, non_empty]
Count = Annotated[int, at_least(0)]
Positive = Annotated[int, at_least(1)]
Hash = Annotated[int, at_least(0)]  # uint64: the upper bound is msgpack's own
Hashes = Annotated[list[int], at_least(0)]


def _hashes_or_none(name: str, value: list[int | None]) -> None:
    if min([v for v in value if v is not None], default=0) < 0:
        raise MessageError(f"{name} must be >= 0")


# One hash per block, None for a block that has none (a partly filled last block).
MaybeHashes = Annotated[list[int | None], _hashes_or_none]
HashChain = Annotated[tuple[int, ...], at_least(0)]
TokenIds = Annotated[list[int], at_least(0)]
Prompt = Annotated[list[int], at_least(0), non_empty]


Checker = Callable[[Any, str], Any]  # (value, field name) -> value, floats widened; or MessageError
_FIELD_CHECKERS: dict[type, list[tuple[str, Checker]]] = {}
_REQUIRED: dict[type, frozenset[str]] = {}


def field_checkers(cls: type) -> list[tuple[str, Checker]]:
    """Per dataclass, one compiled checker per field (built once: messages are on the hot path)."""
    if cls not in _FIELD_CHECKERS:
        hints = typing.get_type_hints(cls, include_extras=True)
        fields = dataclasses.fields(cls)
        _FIELD_CHECKERS[cls] = [(f.name, _compile(hints[f.name])) for f in fields]
        _REQUIRED[cls] = frozenset(
            f.name for f in fields if f.default is f.default_factory is dataclasses.MISSING
        )
    return _FIELD_CHECKERS[cls]


def check_record(record: Any) -> None:
    """Check every field of a dataclass where it is built (from its `__post_init__`; frozen ones too),
    so a bad value fails there, not on the far side of a socket."""
    for name, check in field_checkers(type(record)):
        object.__setattr__(record, name, check(getattr(record, name), name))


def wire_form(value: Any) -> Any:
    """msgpack's `default` hook: a record as the map of its fields (+ "kind"), an enum as its value."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        data = {name: getattr(value, name) for name, _ in field_checkers(type(value))}
        kind = getattr(value, "KIND", None)
        return data if kind is None else {"kind": kind, **data}
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"cannot encode a {type(value).__name__}")


def _compile(tp: Any) -> Checker:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        return _annotated(_compile(args[0]), args[1:])
    if origin in (Union, types.UnionType):
        return _union(args)
    if origin is Literal:
        return _one_of(args)
    if origin in (list, tuple):
        return _sequence(origin, args)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _records((tp,))
    return lambda value, name: _scalar(origin or tp, value, name)


def _annotated(inner: Checker, constraints: tuple) -> Checker:
    def check(value: Any, name: str) -> Any:
        value = inner(value, name)
        for constraint in constraints:
            constraint(name, value)
        return value

    return check


def _union(args: tuple) -> Checker:
    members = tuple(a for a in args if a is not type(None))
    inner = _compile(members[0]) if len(members) == 1 else _records(members)
    if len(members) == len(args):
        return inner
    return lambda value, name: None if value is None else inner(value, name)


def _one_of(choices: tuple) -> Checker:
    def check(value: Any, name: str) -> Any:
        if type(value) is not str or value not in choices:
            raise MessageError(f"{name} must be one of {choices}, got {value!r}")
        return value

    return check


def _enum(cls: type[enum.Enum]) -> Checker:
    by_value = {member.value: member for member in cls}

    def check(value: Any, name: str) -> Any:
        if isinstance(value, cls):
            return value
        member = by_value.get(value) if type(value) is str else None
        if member is None:
            raise MessageError(f"{name} must be one of {tuple(by_value)}, got {value!r}")
        return member

    return check


def _sequence(origin: type, args: tuple) -> Checker:
    """list[X], tuple[X, ...] (both arrive as lists; tuples are rebuilt) and fixed tuple[X, Y]."""
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        return _fixed_tuple(tuple(_compile(a) for a in args))
    if args[0] is int:
        return _int_list if origin is list else _int_tuple
    if origin is list and args[0] == int | None:
        return _optional_int_list
    element = _compile(args[0])
    allowed = (list,) if origin is list else (list, tuple)
    valid = BULK_CHECKS.get(args[0])

    def check(value: Any, name: str) -> Any:
        if type(value) not in allowed:
            raise MessageError(f"{name} must be a list, got {type(value).__name__}")
        if valid is not None and valid(value):
            return origin(value)  # all valid: the same copy the per-element path makes
        return origin(element(v, f"{name}[{i}]") for i, v in enumerate(value))

    return check


def _fixed_tuple(elements: tuple[Checker, ...]) -> Checker:
    def check(value: Any, name: str) -> Any:
        if type(value) not in (list, tuple) or len(value) != len(elements):
            raise MessageError(f"{name} must be a list of {len(elements)} items")
        return tuple(c(v, f"{name}[{i}]") for i, (c, v) in enumerate(zip(elements, value, strict=True)))

    return check


def _records(classes: tuple[type, ...]) -> Checker:
    """A record, or one of several told apart by "kind"; instances are checked, maps are decoded."""
    by_kind = {getattr(cls, "KIND", None): cls for cls in classes}
    if len(classes) > 1 and None in by_kind:
        raise TypeError(f"a union of records needs a KIND on each member: {classes}")

    def check(value: Any, name: str) -> Any:
        if isinstance(value, classes):
            for field, checker in field_checkers(type(value)):
                checker(getattr(value, field), f"{name}.{field}")
            return value
        if type(value) is not dict:
            raise MessageError(f"{name} must be a map, got {type(value).__name__}")
        if None in by_kind:  # a single record without a kind
            return _record_from_map(classes[0], value, name)
        kind = value.get("kind")
        cls = by_kind.get(kind) if type(kind) is str else None
        if cls is None:
            raise MessageError(f"{name}.kind must be one of {tuple(by_kind)}, got {kind!r}")
        return _record_from_map(cls, value, name)

    return check


def _record_from_map(cls: type, value: dict, name: str) -> Any:
    checkers = field_checkers(cls)
    data = {k: v for k, v in value.items() if k != "kind"} if hasattr(cls, "KIND") else value
    known = {field for field, _ in checkers}
    unknown = [k for k in data if k not in known]
    if unknown:
        raise MessageError(f"{name}: unknown field {unknown[0]!r}")
    missing = sorted(_REQUIRED[cls] - data.keys())
    if missing:
        raise MessageError(f"{name}: missing field {missing[0]!r}")
    values = {field: checker(data[field], f"{name}.{field}") for field, checker in checkers if field in data}
    try:
        return cls(**values)
    except ValueError as e:  # the record's own checks (ranges, cross-field rules)
        raise MessageError(f"{name}: {e}") from None


def _scalar(tp: type, value: Any, name: str) -> Any:
    if not SCALARS[tp](value):
        raise MessageError(f"{name} must be a {tp.__name__}, got {type(value).__name__}")
    return float(value) if tp is float else value


def _check_ints(value: Any, name: str) -> None:
    """Token ids and hashes: long sequences, so the element checks run in C (map/set/min/max)."""
    if not only_type(value, int):
        raise MessageError(f"{name} must be a list of ints")
    if value and (min(value) < INT_MIN or max(value) > UINT64_MAX):
        raise MessageError(f"{name} holds an int msgpack cannot carry")


def _int_list(value: Any, name: str) -> list[int]:
    if type(value) is not list:
        raise MessageError(f"{name} must be a list of ints")
    _check_ints(value, name)
    return value


def _optional_int_list(value: Any, name: str) -> list[int | None]:
    """Hashes with gaps: long too, so checked like `_int_list` once the Nones are set aside."""
    if type(value) is not list:
        raise MessageError(f"{name} must be a list of ints or nils")
    _check_ints([v for v in value if v is not None], name)
    return value


def _int_tuple(value: Any, name: str) -> tuple[int, ...]:
    if type(value) not in (list, tuple):
        raise MessageError(f"{name} must be a list of ints")
    _check_ints(value, name)
    return tuple(value)


# What a worker may report in TokenOutput.timings (the router adds "router_queue" and "decode").
TIMING_STAGES = ("prefill_queue", "prefill", "transfer", "decode_admission")


def check_timings(timings: dict) -> None:
    """Stage name -> seconds: names from TIMING_STAGES, finite non-negative numbers (ints widened)."""
    for stage, seconds in timings.items():
        if stage not in TIMING_STAGES:
            raise MessageError(f"timings keys must be among {TIMING_STAGES}, got {stage!r}")
        if type(seconds) not in (int, float) or not (math.isfinite(seconds) and seconds >= 0):
            raise MessageError(f"timings[{stage!r}] must be a finite number >= 0, got {seconds!r}")
        timings[stage] = float(seconds)
