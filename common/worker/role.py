"""What the engine loop asks of a role (prefill or decode), and what it hands the role to work with.

Every hook runs in the engine loop's thread, so a role's state needs no locks; a role talks to the
outside only through `ctx.channels` (queued messages) and its KV sender/receiver (non-blocking calls).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from common.messages import Message, RequestFailed, TokenOutput

if TYPE_CHECKING:
    from common.llm_engine import LLMEngine, StepResult
    from common.worker.channels import WorkerChannels
    from common.worker.config import WorkerConfig


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
    channels: WorkerChannels
    host: str  # the resolved address this worker binds and advertises

    @property
    def worker_id(self) -> str:
        return self.config.worker_id

    def fail(self, request_id: str, error: str, retryable: bool) -> None:
        self.channels.to_router(RequestFailed(request_id, self.worker_id, error, retryable))

    def finish_aborted(self, request_id: str, index: int, num_prompt_tokens: int) -> None:
        """End a request the worker itself gave up on (deadline) with an empty "abort" message."""
        msg = TokenOutput(request_id, self.worker_id, index, [], "abort", num_prompt_tokens, 0)
        self.channels.to_router(msg)


class WorkerRole(ABC):
    name: ClassVar[str]  # "prefill" | "decode"
    request_type: ClassVar[type[Message]]  # the command that starts a request on this role
    publishes_events: ClassVar[bool] = False

    @abstractmethod
    def start(self, ctx: WorkerContext) -> dict:
        """Start the KV transfer side; returns the `kv_endpoint` summary for the registration."""

    @abstractmethod
    def submit(self, msg: Message) -> None:
        """A new request (already checked against the abort memory)."""

    @abstractmethod
    def abort(self, request_id: str) -> bool:
        """Drop the request and free its blocks; False if unknown. Must be idempotent."""

    @abstractmethod
    def snapshot(self, msg: Message) -> None:
        """Answer a SnapshotRequest (only prefill workers hold an index the router mirrors)."""

    @abstractmethod
    def poll(self) -> None:
        """Collect finished background work (transfers, releases); never blocks."""

    @abstractmethod
    def on_step(self, result: StepResult) -> None:
        """Turn one engine step's token updates into messages."""

    @abstractmethod
    def expire(self, now: float) -> None:
        """Abort requests whose deadline (Unix time) is before `now`."""

    @abstractmethod
    def after_iteration(self) -> None:
        """End of one loop turn (e.g. publish cache events)."""

    @abstractmethod
    def poll_interval(self) -> float | None:
        """How soon `poll` has something to do while the engine is idle (None: only on commands)."""

    @abstractmethod
    def load(self) -> LoadReport: ...

    @abstractmethod
    def fail_all(self, error: str) -> None:
        """The engine broke: fail every request (retryably) and forget it."""

    @abstractmethod
    def close(self) -> None:
        """Stop the KV transfer side."""
