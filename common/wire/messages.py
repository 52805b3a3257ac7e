"""Typed wire messages between the router and the workers, and their protocol.

How every message is encoded and checked is `common.wire.codec` (msgpack, never pickle; a malformed
message raises `MessageError`, a `ValueError` naming the field); its names are re-exported here, and
importing this module registers every message type of the project: these, the two router <-> worker
sub-protocols that have modules of their own (cache events and snapshots, `common.wire.cache_messages`;
KV path probes, `common.wire.probe_messages`) and the KV transfer's control messages
(`common.wire.kv_messages`).

Conventions: block hashes are uint64 ints (see `common.wire.hashing`); times (`sent_at`, `deadline`) are
absolute Unix times from `time.time()` because they cross processes and hosts. Nested values are typed,
one definition each, shared by every process: `sampling` is a `SamplingParams`, `events` are
`common.wire.kv_events.KVEvent`s, `logprobs` are `common.wire.logprobs.TokenLogprob`s, `finish_reason` is
a `FinishReason`, `role` a `common.wire.roles.Role`, `handoff` a `common.wire.handoff.HandOff` (how they
travel: `common.wire.wire_fields`). `WorkerRegister.kv_endpoint` is a worker's KV summary, opaque to
the router.

The protocol -- who sends what, on which socket, and when -- is written out in
`docs/protocol.md`.
"""

from __future__ import annotations

import itertools
from dataclasses import MISSING, dataclass, fields
from typing import Annotated, ClassVar

# Imported for what importing them does: their message types register with the codec.
from common.wire import cache_messages, kv_messages, probe_messages  # noqa: F401
from common.wire.codec import MESSAGE_TYPES, Message, decode, encode  # noqa: F401 - re-exported
from common.wire.handoff import HandOff
from common.wire.logprobs import TokenLogprob
from common.wire.roles import Role
from common.wire.sampling_params import FinishReason, SamplingParams
from common.wire.wire_fields import (  # noqa: F401 - TIMING_STAGES is re-exported
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
    check_timings,
)


class WorkRequest(Message):
    """Base of the commands that make a worker take on a request. Workers only ever see n == 1 (the
    router fans a request out into n); a malformed one that still names its request is answered with
    `RequestFailed` rather than silence (see `decode`)."""

    NAMES_WORK: ClassVar[bool] = True
    request_id: str
    sampling: SamplingParams
    # The client's X-Request-Id (or the router's generated one): what every log line about the
    # request names (common/wire/request_log.py). Optional, so older senders still validate.
    log_id: str | None
    # The inbox of the router front that admitted the request: the worker sends the request's tokens,
    # failures and finish there (None: to the router address the worker registered with).
    reply_to: str | None

    @property
    def log_name(self) -> str:
        return self.log_id or self.request_id

    def validate(self) -> None:
        if self.sampling.n != 1:
            raise MessageError(f"sampling.n must be 1 on the wire, got {self.sampling.n}")


@dataclass
class WorkerRegister(Message):
    """Worker -> router inbox, once at start (re-sending it unchanged is an idempotent refresh)."""

    TYPE: ClassVar[str] = "worker_register"
    worker_id: Id
    role: Role
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
    # The cluster node the worker runs on, as its launcher's backend names it (the Ray node id);
    # shown in /health so an operator sees where each worker was placed. None: not named.
    node_id: str | None = None


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
class PrefillRequest(WorkRequest):
    """Router -> prefill worker command socket: compute the prompt's KV and the first token."""

    TYPE: ClassVar[str] = "prefill_request"
    request_id: Id
    prompt_token_ids: Prompt
    sampling: SamplingParams
    decode_worker_id: Id
    decode_command_addr: Id
    deadline: float | None
    log_id: str | None = None
    reply_to: str | None = None


@dataclass
class GenerateRequest(WorkRequest):
    """Router -> decode or mixed worker command socket: prefill the prompt here, then decode it.

    The worker computes the prompt itself (no KV transfer) and streams every completion token,
    starting at index 0, exactly as a prefill worker and a decode worker would together. The router
    sends it when it decides against disaggregating a request (`--disagg never|auto`)."""

    TYPE: ClassVar[str] = "generate_request"
    request_id: Id
    prompt_token_ids: Prompt
    sampling: SamplingParams
    deadline: float | None
    log_id: str | None = None
    reply_to: str | None = None


@dataclass
class DecodeRequest(WorkRequest):
    """Prefill worker -> decode worker command socket: continue a sequence whose KV `handoff` names
    (the publication the decode worker fetches it from)."""

    TYPE: ClassVar[str] = "decode_request"
    request_id: Id
    prompt_token_ids: Prompt
    first_token_id: Count
    sampling: SamplingParams
    handoff: HandOff
    prefill_worker_id: Id
    deadline: float | None
    log_id: str | None = None
    reply_to: str | None = None

    def validate(self) -> None:
        super().validate()
        if self.handoff.request_id != self.request_id:
            raise MessageError(f"handoff.request_id must be {self.request_id!r}")


@dataclass
class TokenOutput(Message):
    """Any worker -> router inbox: generated tokens of one request.

    `index` is the completion position of token_ids[0] (prefill sends 0, decode 1..). A message with
    `finish_reason` set is the request's last; only then may token_ids be empty. `logprobs`, when the
    request asked for them, has one entry per token.
    """

    TYPE: ClassVar[str] = "token_output"
    request_id: Id
    worker_id: Id
    index: Count
    token_ids: TokenIds
    finish_reason: FinishReason | None
    num_prompt_tokens: Count
    cached_tokens: Count
    logprobs: list[TokenLogprob] | None = None
    kv_transfer_bytes: Count = 0
    kv_transfer_seconds: Annotated[float, at_least(0)] = 0.0
    # Stage -> seconds spent there (keys from TIMING_STAGES), sent at most once per worker per request.
    timings: dict[str, float] | None = None

    def validate(self) -> None:
        if not self.token_ids and self.finish_reason is None:
            raise MessageError("token_ids must not be empty unless finish_reason is set")
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            n, got = len(self.token_ids), len(self.logprobs)
            raise MessageError(f"logprobs must have one entry per token ({n}), got {got}")
        if self.timings is not None:
            check_timings(self.timings)


@dataclass
class TokenBatch(Message):
    """Any worker -> router inbox: one engine step's plain tokens for many requests, as columns.

    Row i means what `TokenOutput(request_ids[i], worker_id, indexes[i], token_ids[i], None,
    num_prompt_tokens[i], 0)` means. Only such mid-stream rows travel here; a request's first and last
    message, and any with logprobs, timings or transfer figures, stay TokenOutputs. One message per step
    instead of one per request is what lets a decode worker stream a few hundred sequences at a few
    milliseconds per step without its engine thread spending that step building messages."""

    TYPE: ClassVar[str] = "token_batch"
    worker_id: Id
    request_ids: list[str]
    indexes: Annotated[list[int], at_least(0)]
    token_ids: list[list[int]]
    num_prompt_tokens: Annotated[list[int], at_least(0)]

    def validate(self) -> None:
        n = len(self.request_ids)
        for name in ("indexes", "token_ids", "num_prompt_tokens"):
            if len(getattr(self, name)) != n:
                raise MessageError(f"{name} must have one entry per request id ({n})")
        if not all(self.request_ids):
            raise MessageError("request_ids must not contain an empty id")
        rows = self.token_ids
        # One pass in C over all rows (a few hundred per step, built on the worker's hot path).
        if not all(rows) or (rows and min(itertools.chain.from_iterable(rows)) < 0):
            raise MessageError("token_ids rows must be non-empty lists of ids >= 0")

    def outputs(self) -> list[TokenOutput]:
        """The rows as TokenOutputs. The batch was checked as a whole, so the rows skip the per-message
        checks (this is the router's hot path)."""
        out = []
        for rid, index, ids, prompt in zip(
            self.request_ids, self.indexes, self.token_ids, self.num_prompt_tokens, strict=True
        ):
            row = TokenOutput.__new__(TokenOutput)
            row.__dict__.update(_ROW_DEFAULTS)
            row.request_id, row.worker_id, row.index, row.token_ids = rid, self.worker_id, index, ids
            row.num_prompt_tokens = prompt
            out.append(row)
        return out


# A TokenBatch row's other fields: TokenOutput's defaults, and those of a plain mid-stream token.
_ROW_DEFAULTS = {f.name: f.default for f in fields(TokenOutput) if f.default is not MISSING}
_ROW_DEFAULTS.update(finish_reason=None, cached_tokens=0)


@dataclass
class RequestFailed(Message):
    """Any worker -> router inbox: the request cannot complete on this worker.

    `retryable` means another worker may succeed (e.g. out of blocks, shutting down); the router
    retries only if the client has not seen any token yet. `invalid`: the request itself is wrong for
    this model (a token id outside its vocabulary, a grammar llguidance refuses once it meets the
    tokenizer): the client's error, which the router answers with a 400 carrying `error`.
    """

    TYPE: ClassVar[str] = "request_failed"
    request_id: Id
    worker_id: Id
    error: str
    retryable: bool
    invalid: bool = False


@dataclass
class Abort(Message):
    """Router -> worker command socket: drop the request and free its blocks (idempotent)."""

    TYPE: ClassVar[str] = "abort"
    request_id: Id


@dataclass
class Shutdown(Message):
    """Router -> worker command socket: finish nothing more and exit."""

    TYPE: ClassVar[str] = "shutdown"
    reason: str = ""
