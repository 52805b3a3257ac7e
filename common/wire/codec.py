"""The one msgpack codec of the project's messages (never pickle): `Message`, `encode`, `decode`.

Every message is a dataclass subclass of `Message` with a class-level `TYPE` tag; defining one registers
it here. `encode(msg)` packs `{"type": TYPE, **fields}` with msgpack; `decode(data)` checks the tag,
the field names and every field's type and raises `MessageError` -- a `ValueError` naming the field --
for anything malformed, whatever the bytes. Constructing a message validates it the same way, so a bad
message fails where it is built rather than on the far side of a socket.

`decode(data, trusted=...)` builds the listed types without the per-field checks: for the router's
per-token path, whose messages (`TokenOutput`, `TokenBatch`) come from the cluster's own workers, which
built them through the validating constructor. The tag and the field names are still checked (a
`MessageError` otherwise), and fields that are typed values (enums, records, tuples) are still
converted, checked, from their wire form; anything from outside the cluster is never decoded that way.
`build_checked_parts(cls, **fields)` is the sending side's counterpart, for a message built from parts
the sender has checked already (the router's per-request commands): no per-field checks where it is
built; the receiver still decodes it with all of them.

Two families use it: the router <-> worker messages (`common.wire.messages`) and the KV transfer's
control messages between a sender and a receiver (`common.wire.kv_messages`); importing
`common.wire.messages` registers both (and the router <-> worker sub-protocols of their own modules).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import ClassVar

import msgpack

from common.wire.msgpack_values import plain_on_the_wire
from common.wire.wire_fields import MessageError, check_record, field_checkers, wire_form

MESSAGE_TYPES: dict[str, type[Message]] = {}


class Message:
    """Base of all wire messages. Subclasses are dataclasses that set `TYPE`."""

    TYPE: ClassVar[str] = ""
    # Whether a malformed message of this type that still names its `request_id` should fail that
    # request (commands that start work) rather than be dropped silently (see `decode`).
    NAMES_WORK: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("TYPE"):  # a concrete message, not an intermediate base
            if cls.TYPE in MESSAGE_TYPES:
                raise TypeError(f"message type {cls.TYPE!r} is defined twice")
            MESSAGE_TYPES[cls.TYPE] = cls

    def __post_init__(self) -> None:
        check_record(self)
        self.validate()

    def validate(self) -> None:
        """Invariants across fields; raise MessageError naming the field."""


def encode(msg: Message) -> bytes:
    """msgpack of {"type": tag, **fields}; the message was validated when it was built."""
    if not isinstance(msg, Message) or MESSAGE_TYPES.get(msg.TYPE) is not type(msg):
        raise MessageError(f"not a wire message: {type(msg).__name__}")
    payload = {"type": msg.TYPE, **{name: getattr(msg, name) for name, _ in field_checkers(type(msg))}}
    try:
        return msgpack.packb(payload, use_bin_type=True, default=wire_form)
    except (TypeError, ValueError, OverflowError) as e:  # a field mutated after construction
        raise MessageError(f"cannot encode {msg.TYPE}: {e}") from None


def decode(data: bytes | memoryview, trusted: Collection[type[Message]] = ()) -> Message:
    """Parse and validate one message; any malformed input raises MessageError, nothing else.

    When a malformed command that starts work still carries a usable `request_id`, the error's
    `request_id` is set, so the receiver can fail that request instead of leaving it hanging.
    Messages of the `trusted` types skip the per-field checks (see the module docstring)."""
    try:
        payload = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises several unrelated types for garbage input
        raise MessageError(f"not a msgpack message: {type(e).__name__}") from None
    if not isinstance(payload, dict):
        raise MessageError("message must be a msgpack map")
    tag = payload.pop("type", None)
    cls = MESSAGE_TYPES.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise MessageError(f"type: unknown message type {tag!r}")
    try:
        return _build_trusted(cls, payload) if cls in trusted else _build(cls, payload)
    except MessageError as e:
        request_id = payload.get("request_id")
        if cls.NAMES_WORK and type(request_id) is str and request_id:
            e.request_id = request_id
        raise


def _build(cls: type[Message], payload: dict) -> Message:
    names = {name for name, _ in field_checkers(cls)}
    unknown = [k for k in payload if k not in names]
    if unknown:
        raise MessageError(f"{cls.TYPE}: unknown field {unknown[0]!r}")
    try:
        return cls(**payload)
    except MessageError:
        raise
    except TypeError as e:  # a required field is missing
        raise MessageError(f"{cls.TYPE}: {e}") from None


@dataclasses.dataclass(frozen=True)
class _Shape:
    """What a trusted build still needs of a class: its field names, defaults, and the fields whose
    wire form must be converted (with their checkers)."""

    names: frozenset[str]
    required: frozenset[str]
    defaults: dict
    factories: tuple
    converters: tuple


_SHAPES: dict[type, _Shape] = {}


def _shape(cls: type[Message]) -> _Shape:
    shape = _SHAPES.get(cls)
    if shape is None:
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        plain = plain_on_the_wire(cls)
        shape = _SHAPES[cls] = _Shape(
            frozenset(f.name for f in fields),
            frozenset(f.name for f in fields if f.default is f.default_factory is dataclasses.MISSING),
            {f.name: f.default for f in fields if f.default is not dataclasses.MISSING},
            tuple(
                (f.name, f.default_factory) for f in fields if f.default_factory is not dataclasses.MISSING
            ),
            tuple((name, check) for name, check in field_checkers(cls) if name not in plain),
        )
    return shape


def build_checked_parts(cls: type[Message], **fields: object) -> Message:
    """A message from parts this process has already checked, without the per-field checks: the
    router's per-request commands (prompt ids it tokenized or checked against the vocabulary, its own
    ids and addresses, a `SamplingParams` that validated itself). Names and required fields are still
    checked, the defaults filled in. The receiver decodes it with every check, as any other message:
    a part that was wrong after all fails that request there, named, instead of passing silently."""
    return _assemble(cls, fields, convert=False)


def _build_trusted(cls: type[Message], payload: dict) -> Message:
    return _assemble(cls, payload, convert=True)


def _assemble(cls: type[Message], payload: dict, convert: bool) -> Message:
    """The message without its per-field checks; `convert`: typed fields arrive in their wire form."""
    shape = _shape(cls)
    if not payload.keys() <= shape.names:
        raise MessageError(f"{cls.TYPE}: unknown field {next(iter(payload.keys() - shape.names))!r}")
    if not shape.required <= payload.keys():
        raise MessageError(f"{cls.TYPE}: missing field {min(shape.required - payload.keys())!r}")
    if convert:
        for name, check in shape.converters:
            if name in payload:
                payload[name] = check(payload[name], name)
    for name, factory in shape.factories:
        if name not in payload:
            payload[name] = factory()
    msg = cls.__new__(cls)
    msg.__dict__.update(shape.defaults)
    msg.__dict__.update(payload)
    return msg
