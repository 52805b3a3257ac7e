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
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Union

import msgpack

_INT_MIN, _UINT64_MAX = -(2**63), 2**64 - 1  # what msgpack can carry
ROLES = ("prefill", "decode")
FINISH_REASONS = ("stop", "length", "abort")
EVENT_KINDS = ("stored", "removed", "cleared")


class MessageError(ValueError):
    """A message that cannot be encoded or decoded; the text names the offending field."""


class Message:
    """Base of all wire messages. Subclasses are dataclasses that set `TYPE`."""

    TYPE: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for f in fields(self):  # type: ignore[arg-type]
            value = _check(getattr(self, f.name), _hints(type(self))[f.name], f.name)
            object.__setattr__(self, f.name, value)
        self.validate()

    def validate(self) -> None:
        """Message-specific invariants beyond field types; raise MessageError naming the field."""


@dataclass
class WorkerRegister(Message):
    """Worker -> router inbox, once at start (re-sending it unchanged is an idempotent refresh)."""

    TYPE: ClassVar[str] = "worker_register"
    worker_id: str
    role: str
    host: str
    pid: int
    command_addr: str
    events_addr: str | None
    kv_endpoint: dict
    block_size: int
    probe_hash: int
    num_kv_blocks: int
    max_model_len: int
    max_num_batched_tokens: int
    model_name: str

    def validate(self) -> None:
        _non_empty("worker_id", self.worker_id)
        _non_empty("command_addr", self.command_addr)
        if self.role not in ROLES:
            raise MessageError(f"role must be one of {ROLES}, got {self.role!r}")
        _min("block_size", self.block_size, 1)
        _uint64("probe_hash", self.probe_hash)
        for name in ("num_kv_blocks", "max_model_len", "max_num_batched_tokens"):
            _min(name, getattr(self, name), 1)


@dataclass
class WorkerHeartbeat(Message):
    """Worker -> router inbox, every ~0.5 s: the load figures the routing policy uses."""

    TYPE: ClassVar[str] = "worker_heartbeat"
    worker_id: str
    num_free_blocks: int
    num_total_blocks: int
    num_waiting: int
    num_running: int
    queued_prefill_tokens: int
    sent_at: float

    def validate(self) -> None:
        for name in ("num_free_blocks", "num_total_blocks", "num_waiting", "num_running"):
            _min(name, getattr(self, name), 0)
        _min("queued_prefill_tokens", self.queued_prefill_tokens, 0)


@dataclass
class PrefillRequest(Message):
    """Router -> prefill worker command socket: compute the prompt's KV and the first token."""

    TYPE: ClassVar[str] = "prefill_request"
    request_id: str
    prompt_token_ids: list[int]
    sampling: dict
    decode_worker_id: str
    decode_command_addr: str
    deadline: float | None

    def validate(self) -> None:
        _non_empty("request_id", self.request_id)
        _token_ids("prompt_token_ids", self.prompt_token_ids, allow_empty=False)


@dataclass
class DecodeRequest(Message):
    """Prefill worker -> decode worker command socket: continue a sequence whose KV is being sent."""

    TYPE: ClassVar[str] = "decode_request"
    request_id: str
    prompt_token_ids: list[int]
    first_token_id: int
    sampling: dict
    kv_endpoint: dict
    src_block_ids: list[int]
    prefill_worker_id: str
    deadline: float | None

    def validate(self) -> None:
        _non_empty("request_id", self.request_id)
        _token_ids("prompt_token_ids", self.prompt_token_ids, allow_empty=False)
        _min("first_token_id", self.first_token_id, 0)
        for block_id in self.src_block_ids:
            _min("src_block_ids", block_id, 0)


@dataclass
class TokenOutput(Message):
    """Any worker -> router inbox: generated tokens of one request.

    `index` is the completion position of token_ids[0] (prefill sends 0, decode 1..). A message with
    `finish_reason` set is the request's last; its token_ids may be empty. `logprobs`, when present,
    has one entry per token: {"logprob": float, "top": [[token_id, logprob], ...]}.
    """

    TYPE: ClassVar[str] = "token_output"
    request_id: str
    worker_id: str
    index: int
    token_ids: list[int]
    finish_reason: str | None
    num_prompt_tokens: int
    cached_tokens: int
    logprobs: list | None = None
    kv_transfer_bytes: int = 0
    kv_transfer_seconds: float = 0.0

    def validate(self) -> None:
        _min("index", self.index, 0)
        _token_ids("token_ids", self.token_ids, allow_empty=self.finish_reason is not None)
        if self.finish_reason is not None and self.finish_reason not in FINISH_REASONS:
            raise MessageError(f"finish_reason must be one of {FINISH_REASONS} or None")
        for name in ("num_prompt_tokens", "cached_tokens", "kv_transfer_bytes"):
            _min(name, getattr(self, name), 0)
        if self.kv_transfer_seconds < 0:
            raise MessageError("kv_transfer_seconds must be >= 0")
        if self.logprobs is not None:
            _check_logprobs(self.logprobs, len(self.token_ids))


@dataclass
class RequestFailed(Message):
    """Any worker -> router inbox: the request cannot complete on this worker.

    `retryable` means nothing was streamed that the client could have seen from this worker's side and
    another worker may succeed (e.g. out of blocks, shutting down); the router decides whether to retry.
    """

    TYPE: ClassVar[str] = "request_failed"
    request_id: str
    worker_id: str
    error: str
    retryable: bool


@dataclass
class Abort(Message):
    """Router -> worker command socket: drop the request and free its blocks (idempotent)."""

    TYPE: ClassVar[str] = "abort"
    request_id: str


@dataclass
class KVEventBatch(Message):
    """Prefill worker PUB socket -> router SUB: cache events, `seq` = previous batch's seq + 1 (first 1).

    Events, applied in order: {"kind": "stored", "hashes": [...], "parent": int | None},
    {"kind": "removed", "hashes": [...]}, {"kind": "cleared"}. Use the helpers below to build them.
    """

    TYPE: ClassVar[str] = "kv_event_batch"
    worker_id: str
    seq: int
    events: list[dict]

    def validate(self) -> None:
        _min("seq", self.seq, 1)
        for i, event in enumerate(self.events):
            _check_event(event, f"events[{i}]")


@dataclass
class SnapshotRequest(Message):
    """Router -> prefill worker command socket: send a Snapshot of every block hash you hold."""

    TYPE: ClassVar[str] = "snapshot_request"
    worker_id: str


@dataclass
class Snapshot(Message):
    """Prefill worker -> router inbox: all cached hashes; `seq` = last event batch reflected (0: none)."""

    TYPE: ClassVar[str] = "snapshot"
    worker_id: str
    seq: int
    hashes: list[int]

    def validate(self) -> None:
        _min("seq", self.seq, 0)
        for h in self.hashes:
            _uint64("hashes", h)


@dataclass
class Shutdown(Message):
    """Router -> worker command socket: finish nothing more and exit."""

    TYPE: ClassVar[str] = "shutdown"
    reason: str = field(default="")


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.TYPE: cls
    for cls in (
        WorkerRegister,
        WorkerHeartbeat,
        PrefillRequest,
        DecodeRequest,
        TokenOutput,
        RequestFailed,
        Abort,
        KVEventBatch,
        SnapshotRequest,
        Snapshot,
        Shutdown,
    )
}


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

_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _check(value: Any, tp: Any, name: str) -> Any:
    """Return `value` (floats widened from ints) if it has type `tp`, else raise MessageError."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return None
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return _check(value, inner, name)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise MessageError(f"{name} must be a number, got {type(value).__name__}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int) or not _INT_MIN <= value <= _UINT64_MAX:
            raise MessageError(f"{name} must be an int, got {type(value).__name__}")
        return value
    if tp in (str, bool):
        if not isinstance(value, tp):
            raise MessageError(f"{name} must be a {tp.__name__}, got {type(value).__name__}")
        return value
    if tp is dict or origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise MessageError(f"{name} must be a map with string keys")
        return value
    if tp is list or origin is list:
        if not isinstance(value, list):
            raise MessageError(f"{name} must be a list, got {type(value).__name__}")
        args = typing.get_args(tp)
        return [_check(v, args[0], name) for v in value] if args else value
    raise MessageError(f"{name}: unsupported field type {tp!r}")  # a bug in this module


def _non_empty(name: str, value: str) -> None:
    if not value:
        raise MessageError(f"{name} must not be empty")


def _min(name: str, value: int, low: int) -> None:
    if value < low:
        raise MessageError(f"{name} must be >= {low}, got {value}")


def _uint64(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _UINT64_MAX:
        raise MessageError(f"{name} must hold uint64 block hashes, got {value!r}")


def _token_ids(name: str, ids: list[int], allow_empty: bool) -> None:
    if not ids and not allow_empty:
        raise MessageError(f"{name} must not be empty")
    if any(t < 0 for t in ids):
        raise MessageError(f"{name} must hold non-negative token ids")


def _check_event(event: dict, name: str) -> None:
    kind = event.get("kind")
    expected = {"stored": {"kind", "hashes", "parent"}, "removed": {"kind", "hashes"}, "cleared": {"kind"}}
    if kind not in expected:
        raise MessageError(f"{name}.kind must be one of {EVENT_KINDS}, got {kind!r}")
    if set(event) != expected[kind]:
        raise MessageError(f"{name} ({kind}) must have exactly the fields {sorted(expected[kind])}")
    hashes = event.get("hashes", [])
    if not isinstance(hashes, list):
        raise MessageError(f"{name}.hashes must be a list")
    for h in hashes:
        _uint64(f"{name}.hashes", h)
    if kind == "stored" and event["parent"] is not None:
        _uint64(f"{name}.parent", event["parent"])


def _check_logprobs(entries: list, num_tokens: int) -> None:
    if len(entries) != num_tokens:
        raise MessageError(f"logprobs must have one entry per token ({num_tokens}), got {len(entries)}")
    for entry in entries:
        if not isinstance(entry, dict) or set(entry) != {"logprob", "top"}:
            raise MessageError('logprobs entries must be {"logprob": float, "top": [[id, logprob], ...]}')
        _check(entry["logprob"], float, "logprobs.logprob")
        if not isinstance(entry["top"], list):
            raise MessageError("logprobs.top must be a list")
        for pair in entry["top"]:
            if not isinstance(pair, list) or len(pair) != 2:
                raise MessageError("logprobs.top entries must be [token_id, logprob] pairs")
            _check(pair[0], int, "logprobs.top.token_id")
            _check(pair[1], float, "logprobs.top.logprob")
