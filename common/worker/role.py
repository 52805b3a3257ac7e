"""What the engine loop asks of a role (prefill, decode, mixed), and what it hands the role to work with.

Every hook runs in the engine loop's thread, so a role's state needs no locks; a role talks to the
outside only through `ctx.channels` (queued messages), its KV side (a `KVSide`: the kvtransfer sender
or receiver set, non-blocking calls) and the engine's worker-role verbs (common/llm_engine.py).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from common.wire.cache_messages import SnapshotRequest
from common.wire.messages import Message, RequestFailed, TokenOutput
from common.worker.events import EventPublisher

if TYPE_CHECKING:
    from common.core.step_records import StepResult
    from common.llm_engine import LLMEngine
    from common.worker.channels import WorkerChannels
    from common.worker.config import WorkerConfig
    from common.worker.io_process import ProcessChannels

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadReport:
    """The figures a heartbeat carries (posted by the engine thread, read by the I/O thread)."""

    num_free_blocks: int = 0
    num_total_blocks: int = 0
    num_waiting: int = 0
    num_running: int = 0
    queued_prefill_tokens: int = 0


@dataclass
class WorkerContext:
    config: WorkerConfig
    engine: LLMEngine
    channels: WorkerChannels | ProcessChannels  # by --worker-io; the same engine-side methods
    host: str  # the resolved address this worker binds and advertises

    @property
    def worker_id(self) -> str:
        return self.config.worker_id

    def fail(
        self, request_id: str, error: str, retryable: bool, reply_to: str | None, invalid: bool = False
    ) -> None:
        """Tell the front that admitted the request (`reply_to`) that it failed here (`invalid`: the
        request's own fault, see `RequestFailed`)."""
        failed = RequestFailed(request_id, self.worker_id, error, retryable, invalid)
        self.channels.to_front(reply_to, failed)

    def finish_aborted(
        self, request_id: str, index: int, num_prompt_tokens: int, reply_to: str | None
    ) -> None:
        """End a request the worker itself gave up on (deadline) with an empty "abort" message."""
        msg = TokenOutput(request_id, self.worker_id, index, [], "abort", num_prompt_tokens, 0)
        self.channels.to_front(reply_to, msg)


class KVSide(Protocol):
    """A role's KV transfer endpoints (kvtransfer.peers.KVSenderSet / KVReceiverSet)."""

    def start(self) -> None: ...

    def summary(self) -> dict: ...

    def close(self) -> None: ...


class WorkerRole(ABC):
    """One worker role. `jobs` maps request id -> the role's record of a request it holds; the base
    class implements what every role does the same way (KV side start/close, cache events, load
    figures, failing everything after an engine error)."""

    name: ClassVar[str]  # "prefill" | "decode" | "mixed" (the engine role and the registered role)
    request_types: ClassVar[tuple[type[Message], ...]]  # the commands that start a request here
    publishes_events: ClassVar[bool] = False  # publish prefix-cache events and answer snapshots

    def __init__(self) -> None:
        self.jobs: dict[str, Any] = {}
        self.kv: KVSide | None = None
        self.events: EventPublisher | None = None

    # ---- lifecycle -----------------------------------------------------------------------------

    def start(self, ctx: WorkerContext) -> dict:
        """Start the KV transfer side; returns the `kv_endpoint` summary for the registration."""
        self.ctx = ctx
        self.engine: LLMEngine = ctx.engine
        if self.publishes_events:
            self.events = EventPublisher(ctx.worker_id, ctx.channels)
        self.engine.record_kv_events(self.events is not None)
        self.kv = self.open_kv(ctx)
        self.kv.start()
        return self.kv.summary()

    @abstractmethod
    def open_kv(self, ctx: WorkerContext) -> KVSide:
        """The role's (not yet started) KV sender or receiver set."""

    def close(self) -> None:
        """Stop the KV transfer side (idempotent)."""
        if self.kv is not None:
            self.kv.close()

    # ---- commands ------------------------------------------------------------------------------

    @abstractmethod
    def submit(self, msg: Message) -> None:
        """A new request (one of `request_types`, already checked against the abort memory)."""

    @abstractmethod
    def abort(self, request_id: str) -> bool:
        """Drop the request and free its blocks; False if unknown. Must be idempotent."""

    def snapshot(self, msg: Message) -> None:
        """Answer a SnapshotRequest (only roles that publish cache events hold an index to mirror)."""
        if self.events is None:
            log.debug("ignoring %s: this %s worker publishes no cache index", msg.TYPE, self.name)
            return
        assert isinstance(msg, SnapshotRequest)
        self.events.snapshot(self.engine.drain_kv_events(), self.engine.cached_hashes(), msg.reply_to)

    def probe(self, msg: Message) -> None:
        """A KV path probe: KVProbeRequest (prefill role: publish scratch blocks for the decode target)
        or KVProbe (decode targets: fetch and time them). Roles without that side ignore it."""
        log.warning("ignoring %s: a %s worker has no part in it", msg.TYPE, self.name)

    # ---- the loop ------------------------------------------------------------------------------

    @abstractmethod
    def poll(self) -> None:
        """Collect finished background work (transfers, releases); never blocks."""

    @abstractmethod
    def on_step(self, result: StepResult) -> None:
        """Turn one engine step's token updates into messages."""

    @abstractmethod
    def expire(self, now: float) -> None:
        """Abort requests whose deadline (Unix time) is before `now`."""

    def after_iteration(self) -> None:
        """End of one loop turn: publish the step's cache events (kept only by a publishing role)."""
        if self.events is not None:
            self.events.flush(self.engine.drain_kv_events())

    @abstractmethod
    def poll_interval(self) -> float | None:
        """How soon `poll` has something to do while the engine is idle (None: only on commands)."""

    def num_queued(self) -> int:
        """Requests the role holds back from the engine (e.g. waiting for room to reserve blocks)."""
        return 0

    def load(self) -> LoadReport:
        figures = self.engine.load_report()
        return LoadReport(
            num_free_blocks=figures.num_free_blocks,
            num_total_blocks=figures.num_total_blocks,
            num_waiting=figures.num_waiting + figures.num_transferring + self.num_queued(),
            num_running=figures.num_running,
            queued_prefill_tokens=figures.queued_prefill_tokens,
        )

    def drop_front(self, reply_to: str) -> list[str]:
        """The front at `reply_to` is gone: abort (free the KV of) every request it admitted, since
        nobody reads their tokens any more; returns their ids."""
        dropped = [rid for rid, job in self.jobs.items() if job.request.reply_to == reply_to]
        for rid in dropped:
            self.abort(rid)
        return dropped

    def reject(self, request_id: str, error: str) -> None:
        """The engine refused a request it had taken (its grammar, built aside): drop it here too and
        tell its front it is invalid for this model (no other worker would take it)."""
        self._give_up(request_id, error, retryable=False, invalid=True)

    def fail_request(self, request_id: str, error: str) -> None:
        """The engine failed this request alone (`SequencesFailed`: a prefill chunk that kept running
        out of device memory): drop it, freeing its blocks, and fail it retryably (another worker, or
        this one later, may have the memory); the others go on."""
        self._give_up(request_id, error, retryable=True, invalid=False)

    def _give_up(self, request_id: str, error: str, retryable: bool, invalid: bool) -> None:
        job = self.jobs.get(request_id)
        if job is None:
            return
        self.abort(request_id)
        self.jobs.pop(request_id, None)
        self.ctx.fail(request_id, error, retryable=retryable, reply_to=job.request.reply_to, invalid=invalid)

    def fail_all(self, error: str) -> None:
        """The engine broke: fail every request (retryably) and forget it."""
        for rid, job in list(self.jobs.items()):
            self.ctx.fail(rid, error, retryable=True, reply_to=job.request.reply_to)
            try:
                self.abort(rid)
            except Exception:  # the engine may be inconsistent: at least forget the request
                log.exception("could not abort %s", rid)
                self.jobs.pop(rid, None)
