"""Typed wire messages between the router and the workers (msgpack, never pickle).

Every message is a dataclass with a class-level `TYPE` tag. `encode(msg)` packs `{"type": TYPE, **fields}`
with msgpack; `decode(data)` checks the tag, the field names and every field's type (nested values are
plain msgpack types) and raises `MessageError` -- a `ValueError` naming the field -- for anything
malformed, whatever the bytes. Constructing a message validates it the same way, so a bad message
fails where it is built rather than on the far side of a socket.

Conventions: block hashes are uint64 ints (see `common.hashing`); times (`sent_at`, `deadline`) are
absolute Unix times from `time.time()` because they cross processes and hosts; `sampling` is
`SamplingParams.to_dict()`; `kv_endpoint` is opaque to the router and owned by `kvtransfer`.
The full protocol (who sends what, on which socket) is documented in `router/__init__.py`.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Annotated, Any, ClassVar, Union

import msgpack

_INT_MIN, _UINT64_MAX = -(2**63), 2**64 - 1  # what msgpack can carry
ROLES = ("prefill", "decode")
FINISH_REASONS = ("stop", "length", "abort")
EVENT_FIELDS = {"stored": {"kind", "hashes", "parent"}, "removed": {"kind", "hashes"}, "cleared": {"kind"}}


class MessageError(ValueError):
    """A message that cannot be encoded or decoded; the text names the offending field."""


# Field constraints, attached with typing.Annotated and checked on construction. On a list, _min applies
# to each element while _non_empty is about the list itself.
def _min(low: int) -> Callable[[str, Any], None]:
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


def _non_empty(name: str, value: Any) -> None:
    if not value:
        raise MessageError(f"{name} must not be empty")


def _one_of(*choices: str) -> Callable[[str, Any], None]:
    def check(name: str, value: Any) -> None:
        if value is not None and value not in choices:
            raise MessageError(f"{name} must be one of {choices}, got {value!r}")

    return check


Id = Annotated[str, _non_empty]
Count = Annotated[int, _min(0)]
Positive = Annotated[int, _min(1)]
Hash = Annotated[int, _min(0)]  # uint64: the upper bound is msgpack's own
Hashes = Annotated[list[int], _min(0)]
TokenIds = Annotated[list[int], _min(0)]
Prompt = Annotated[list[int], _min(0), _non_empty]


class Message:
    """Base of all wire messages. Subclasses are dataclasses that set `TYPE`."""

    TYPE: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for name, check in _checkers(type(self)):
            object.__setattr__(self, name, check(getattr(self, name), name))
        self.validate()

    def validate(self) -> None:
        """Invariants across fields; raise MessageError naming the field."""


@dataclass
class WorkerRegister(Message):
    """Worker -> router inbox, once at start (re-sending it unchanged is an idempotent refresh)."""

    TYPE: ClassVar[str] = "worker_register"
    worker_id: Id
    role: Annotated[str, _one_of(*ROLES)]
    host: str
    pid: Count
    command_addr: Id
    events_addr: str | None
    kv_endpoint: dict
    block_size: Positive
    probe_hash: Hash
    num_kv_blocks: Positive
    max_model_len: Positive
    max_num_batched_tokens: Positive
    model_name: str


@dataclass
class WorkerHeartbeat(Message):
    """Worker -> router inbox, every ~0.5 s: the load figures the routing policy uses."""

    TYPE: ClassVar[str] = "worker_heartbeat"
    worker_id: Id
    num_free_blocks: Count
    num_total_blocks: Count
    num_waiting: Count
    num_running: Count
    queued_prefill_tokens: Count  # prompt tokens accepted but not yet computed
    sent_at: float


@dataclass
class PrefillRequest(Message):
    """Router -> prefill worker command socket: compute the prompt's KV and the first token."""

    TYPE: ClassVar[str] = "prefill_request"
    request_id: Id
    prompt_token_ids: Prompt
    sampling: dict
    decode_worker_id: Id
    decode_command_addr: Id
    deadline: float | None


@dataclass
class DecodeRequest(Message):
    """Prefill worker -> decode worker command socket: continue a sequence whose KV is being sent."""

    TYPE: ClassVar[str] = "decode_request"
    request_id: Id
    prompt_token_ids: Prompt
    first_token_id: Count
    sampling: dict
    kv_endpoint: dict
    src_block_ids: Annotated[list[int], _min(0)]
    prefill_worker_id: Id
    deadline: float | None


@dataclass
class TokenOutput(Message):
    """Any worker -> router inbox: generated tokens of one request.

    `index` is the completion position of token_ids[0] (prefill sends 0, decode 1..). A message with
    `finish_reason` set is the request's last; only then may token_ids be empty. `logprobs`, when
    present, has one entry per token: {"logprob": float, "top": [[token_id, logprob], ...]}.
    """

    TYPE: ClassVar[str] = "token_output"
    request_id: Id
    worker_id: Id
    index: Count
    token_ids: TokenIds
    finish_reason: Annotated[str | None, _one_of(*FINISH_REASONS)]
    num_prompt_tokens: Count
    cached_tokens: Count
    logprobs: list | None = None
    kv_transfer_bytes: Count = 0
    kv_transfer_seconds: Annotated[float, _min(0)] = 0.0

    def validate(self) -> None:
        if not self.token_ids and self.finish_reason is None:
            raise MessageError("token_ids must not be empty unless finish_reason is set")
        if self.logprobs is not None:
            _check_logprobs(self.logprobs, len(self.token_ids))


@dataclass
class RequestFailed(Message):
    """Any worker -> router inbox: the request cannot complete on this worker.

    `retryable` means another worker may succeed (e.g. out of blocks, shutting down); the router
    retries only if the client has not seen any token yet.
    """

    TYPE: ClassVar[str] = "request_failed"
    request_id: Id
    worker_id: Id
    error: str
    retryable: bool


@dataclass
class Abort(Message):
    """Router -> worker command socket: drop the request and free its blocks (idempotent)."""

    TYPE: ClassVar[str] = "abort"
    request_id: Id


@dataclass
class KVEventBatch(Message):
    """Prefill worker PUB socket -> router SUB: cache events, `seq` = previous batch's seq + 1 (first 1).

    Events, applied in order: {"kind": "stored", "hashes": [...], "parent": int | None},
    {"kind": "removed", "hashes": [...]}, {"kind": "cleared"}. Use the helpers below to build them.
    """

    TYPE: ClassVar[str] = "kv_event_batch"
    worker_id: Id
    seq: Positive
    events: list[dict]

    def validate(self) -> None:
        for i, event in enumerate(self.events):
            _check_event(event, f"events[{i}]")


@dataclass
class SnapshotRequest(Message):
    """Router -> prefill worker command socket: send a Snapshot of every block hash you hold."""

    TYPE: ClassVar[str] = "snapshot_request"
    worker_id: Id


@dataclass
class Snapshot(Message):
    """Prefill worker -> router inbox: all cached hashes; `seq` = last event batch reflected (0: none)."""

    TYPE: ClassVar[str] = "snapshot"
    worker_id: Id
    seq: Count
    hashes: Hashes


@dataclass
class Shutdown(Message):
    """Router -> worker command socket: finish nothing more and exit."""

    TYPE: ClassVar[str] = "shutdown"
    reason: str = ""


MESSAGE_TYPES: dict[str, type[Message]] = {cls.TYPE: cls for cls in Message.__subclasses__()}


def stored_event(hashes: list[int], parent: int | None) -> dict:
    return {"kind": "stored", "hashes": list(hashes), "parent": parent}


def removed_event(hashes: list[int]) -> dict:
    return {"kind": "removed", "hashes": list(hashes)}


def cleared_event() -> dict:
    return {"kind": "cleared"}


def encode(msg: Message) -> bytes:
    """msgpack of {"type": tag, **fields}; the message was validated when it was built."""
    if not isinstance(msg, Message) or MESSAGE_TYPES.get(msg.TYPE) is not type(msg):
        raise MessageError(f"not a wire message: {type(msg).__name__}")
    payload = {"type": msg.TYPE, **{f.name: getattr(msg, f.name) for f in fields(msg)}}  # type: ignore[arg-type]
    try:
        return msgpack.packb(payload, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:  # a field mutated after construction
        raise MessageError(f"cannot encode {msg.TYPE}: {e}") from None


def decode(data: bytes) -> Message:
    """Parse and validate one message; any malformed input raises MessageError, nothing else."""
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
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = [k for k in payload if k not in names]
    if unknown:
        raise MessageError(f"{cls.TYPE}: unknown field {unknown[0]!r}")
    try:
        return cls(**payload)
    except MessageError:
        raise
    except TypeError as e:  # a required field is missing
        raise MessageError(f"{cls.TYPE}: {e}") from None


# ---- field checking -------------------------------------------------------------------------------

Checker = Callable[[Any, str], Any]  # (value, field name) -> value, floats widened; or MessageError
_CHECKERS: dict[type, list[tuple[str, Checker]]] = {}


def _checkers(cls: type) -> list[tuple[str, Checker]]:
    """Per message class, one compiled checker per field (built once: messages are on the hot path)."""
    if cls not in _CHECKERS:
        hints = typing.get_type_hints(cls, include_extras=True)
        _CHECKERS[cls] = [(f.name, _compile(hints[f.name])) for f in fields(cls)]
    return _CHECKERS[cls]


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


def _check_event(event: dict, name: str) -> None:
    kind = event.get("kind")
    if kind not in EVENT_FIELDS:
        raise MessageError(f"{name}.kind must be one of {tuple(EVENT_FIELDS)}, got {kind!r}")
    if set(event) != EVENT_FIELDS[kind]:
        raise MessageError(f"{name} ({kind}) must have exactly the fields {sorted(EVENT_FIELDS[kind])}")
    if kind != "cleared":
        _check_hashes(event["hashes"], f"{name}.hashes")
    if kind == "stored":
        _check_parent(event["parent"], f"{name}.parent")


def _check_logprobs(entries: list, num_tokens: int) -> None:
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
