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

from dataclasses import dataclass, fields
from typing import Annotated, ClassVar

import msgpack

from common.wire_fields import (  # noqa: F401 - ROLES etc. are re-exported
    EVENT_FIELDS,
    FINISH_REASONS,
    ROLES,
    TIMING_STAGES,
    Count,
    Hash,
    Hashes,
    Id,
    MessageError,
    Positive,
    Prompt,
    TokenIds,
    at_least,
    check_event,
    check_logprobs,
    check_timings,
    field_checkers,
    non_empty,
    one_of,
)


class Message:
    """Base of all wire messages. Subclasses are dataclasses that set `TYPE`."""

    TYPE: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for name, check in field_checkers(type(self)):
            object.__setattr__(self, name, check(getattr(self, name), name))
        self.validate()

    def validate(self) -> None:
        """Invariants across fields; raise MessageError naming the field."""


@dataclass
class WorkerRegister(Message):
    """Worker -> router inbox, once at start (re-sending it unchanged is an idempotent refresh)."""

    TYPE: ClassVar[str] = "worker_register"
    worker_id: Id
    role: Annotated[str, one_of(*ROLES)]
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
class GenerateRequest(Message):
    """Router -> decode or mixed worker command socket: prefill the prompt here, then decode it.

    The worker computes the prompt itself (no KV transfer) and streams every completion token,
    starting at index 0, exactly as a prefill worker and a decode worker would together. The router
    sends it when it decides against disaggregating a request (`--disagg never|auto`)."""

    TYPE: ClassVar[str] = "generate_request"
    request_id: Id
    prompt_token_ids: Prompt
    sampling: dict
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
    src_block_ids: Annotated[list[int], at_least(0)]
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
    finish_reason: Annotated[str | None, one_of(*FINISH_REASONS)]
    num_prompt_tokens: Count
    cached_tokens: Count
    logprobs: list | None = None
    kv_transfer_bytes: Count = 0
    kv_transfer_seconds: Annotated[float, at_least(0)] = 0.0
    # Stage -> seconds spent there (keys from TIMING_STAGES), sent at most once per worker per request.
    timings: dict[str, float] | None = None

    def validate(self) -> None:
        if not self.token_ids and self.finish_reason is None:
            raise MessageError("token_ids must not be empty unless finish_reason is set")
        if self.logprobs is not None:
            check_logprobs(self.logprobs, len(self.token_ids))
        if self.timings is not None:
            check_timings(self.timings)


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
            check_event(event, f"events[{i}]")


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
