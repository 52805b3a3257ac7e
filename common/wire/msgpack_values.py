"""What msgpack hands a decoder, and when that already is a field's value, tested without raising.

Apart from the field checkers (`common.wire.wire_fields`) because these predicates are the fast path:
they answer yes or no for a whole value in one pass, in C where the value is a long list (token ids,
a TokenBatch's columns), and only a value they refuse goes through the checkers, which name the bad
element. The trusted decode (`common.wire.codec`) asks `plain_on_the_wire` which fields need no check.
"""

from __future__ import annotations

import dataclasses
import itertools
import types
import typing
from collections.abc import Callable, Iterable
from typing import Annotated, Any, Union

INT_MIN, UINT64_MAX = -(2**63), 2**64 - 1  # what msgpack can carry

SCALARS: dict[type, Callable[[Any], bool]] = {
    # exact types: bool is not an int here, and numpy scalars must be converted (.tolist()) by the sender
    int: lambda v: type(v) is int and INT_MIN <= v <= UINT64_MAX,
    float: lambda v: type(v) in (int, float),
    str: lambda v: type(v) is str,
    bool: lambda v: type(v) is bool,
    dict: lambda v: type(v) is dict and all(type(k) is str for k in v),
    list: lambda v: type(v) is list,
    bytes: lambda v: type(v) is bytes,
}


def plain_on_the_wire(cls: type) -> frozenset[str]:
    """The fields of a dataclass whose decoded msgpack value already is the field's value (scalars,
    lists and maps of them): a trusted decode (`common.wire.codec`) takes those as they come."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return frozenset(f.name for f in dataclasses.fields(cls) if _plain(hints[f.name]))


def _plain(tp: Any) -> bool:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Annotated:
        return _plain(args[0])
    if origin in (Union, types.UnionType, list, dict):
        return all(_plain(a) for a in args)
    return tp is type(None) or tp in SCALARS


def only_type(values: Iterable[Any], tp: type) -> bool:
    """Whether every item is exactly a `tp` (a subclass is not: a bool is no int), in one pass in C:
    token-id lists run to thousands of items. True for no items."""
    return set(map(type, values)) <= {tp}


def _all_str(value: list) -> bool:
    return only_type(value, str)


def _all_int_lists(value: list) -> bool:
    if not only_type(value, list):
        return False
    flat = list(itertools.chain.from_iterable(value))
    if not only_type(flat, int):
        return False
    return not flat or (min(flat) >= INT_MIN and max(flat) <= UINT64_MAX)


# Element types whose lists are checked in one pass in C (a TokenBatch's ids and rows, a few hundred per
# step); a list that fails it goes through the per-element checks, which name the bad element.
BULK_CHECKS: dict[Any, Callable[[list], bool]] = {str: _all_str, list[int]: _all_int_lists}
