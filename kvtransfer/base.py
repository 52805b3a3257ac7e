"""Role-named interfaces of the KV transfer: `KVSender` (prefill side) and `KVReceiver` (decode side).

Invariants every transport keeps (the engines rely on them):

- Constructors do no I/O; `start()` binds sockets and starts the background thread that owns them;
  `close()` stops that thread and closes its sockets promptly (ZMQ linger 0), and is idempotent.
- The engine's thread only calls `publish` / `cancel` / `poll_released` (sender) and `fetch` / `poll` /
  `status` (receiver). Those calls never block on the network and never raise for a network, peer or
  timing failure: such failures come back as a FAILED result with an error string. They raise only
  for the caller's own bugs (`ValueError`: a block id outside the cache, a request id already in
  flight) and for use before `start()` / after `close()` (`RuntimeError`).
- Sender: published blocks are read, never written, and are only read while the publication is live;
  the engine must not write or free them until `poll_released()` reports the request (DONE: the
  receiver acknowledged; FAILED: lease expired or the transfer failed) or it calls `cancel()`.
  Every publication is reported exactly once by `poll_released()`, unless it was cancelled.
- Receiver: destination blocks are written only by the transfer and only before the result is
  reported; once `poll()` returns DONE they hold bitwise the sender's blocks (and on CUDA the copy
  stream has been synchronized), what arrived passed the checks of `verify.py` (binding and checksums,
  unless the config turns them off), and the sender has been sent the acknowledgement. After FAILED the
  transfer never writes them again. Every `fetch` is reported exactly once by `poll()`.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from common.wire.handoff import HandOff, Transport


class TransferStatus(enum.Enum):
    """Where a transfer stands; DONE and FAILED are terminal."""

    PENDING = "pending"
    TRANSFERRING = "transferring"
    DONE = "done"
    FAILED = "failed"

    @property
    def finished(self) -> bool:
        return self in (TransferStatus.DONE, TransferStatus.FAILED)


@dataclass(frozen=True)
class TransferResult:
    """The outcome of one `KVReceiver.fetch`, reported once by `KVReceiver.poll`."""

    request_id: str
    status: TransferStatus
    num_bytes: int = 0
    seconds: float = 0.0
    error: str | None = None


@dataclass(frozen=True)
class Release:
    """A publication the sender no longer needs: the engine may unpin (free) its blocks now.

    DONE: the receiver acknowledged the copy. FAILED: the lease expired, the receiver reported an error,
    or the request could not be served (see `error`)."""

    request_id: str
    status: TransferStatus
    error: str | None = None


class KVSender(ABC):
    """Prefill side: publishes pinned blocks and serves receivers' pulls in a background thread."""

    transport: ClassVar[Transport]

    @abstractmethod
    def start(self) -> None:
        """Bind the sockets and start the background thread."""

    @abstractmethod
    def publish(
        self,
        request_id: str,
        src_block_ids: list[int],
        lease_s: float | None = None,
        block_hashes: Sequence[int] = (),
    ) -> HandOff:
        """Offer blocks for one request until acknowledged or `lease_s` (default: config) passes.

        `block_hashes`: the prompt chain's hash of each full block, in `src_block_ids` order (the
        last block may be partly filled and has none); receivers check them (`verify.py`).
        Returns the hand-off to put in this request's notice: where the sender is and what binds a
        transfer to this publication (its nonce; for ipc, whose receivers read without asking, more).
        Receivers fetch by it alone: the sender serves `src_block_ids` in this order."""

    @abstractmethod
    def cancel(self, request_id: str) -> bool:
        """Drop a publication (abort). No Release follows; the engine may free the blocks on return.

        Returns whether the request was published. Any read of its blocks in progress has finished by
        the time this returns."""

    @abstractmethod
    def poll_released(self) -> list[Release]:
        """Publications that ended since the last call (non-blocking)."""

    @abstractmethod
    def close(self) -> None:
        """Stop the thread and close the sockets; unreleased publications are simply dropped."""

    def __enter__(self) -> KVSender:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class KVReceiver(ABC):
    """Decode side: pulls published blocks into pre-allocated destination blocks in the background."""

    transport: ClassVar[Transport]

    @abstractmethod
    def start(self) -> None:
        """Start the background thread (sockets to senders are opened lazily, one per sender)."""

    @abstractmethod
    def fetch(
        self,
        handoff: HandOff,
        dst_block_ids: list[int],
        timeout_s: float | None = None,
        block_hashes: Sequence[int] | None = None,
    ) -> None:
        """Start copying the publication `handoff` names into `dst_block_ids` (as many blocks, in the
        order they were published); returns at once. Results are reported under `handoff.request_id`.

        `block_hashes`: the prompt's chain (full blocks), which the blocks served must match; None skips
        that check (nonce, epoch and checksums are checked regardless, see `verify.py`).

        Raises ValueError only if the request already has a transfer in flight; every other problem
        (a hand-off of another transport, bad ids, the sender, the network, `timeout_s`) is reported as
        FAILED by `poll`."""

    @abstractmethod
    def poll(self) -> list[TransferResult]:
        """Transfers that finished (DONE or FAILED) since the last call (non-blocking)."""

    def flush(self) -> None:
        """Start every fetch queued since the last call, as few batched copies as the transport allows.

        `poll()` flushes too; calling this right after admitting a burst of fetches just saves the wait
        until the next poll. Never blocks."""
        return None  # transports that start each fetch as it comes have nothing queued

    @abstractmethod
    def status(self, request_id: str) -> TransferStatus | None:
        """Current status, or None for a request never fetched (or long forgotten)."""

    @abstractmethod
    def close(self) -> None:
        """Stop the thread, close the sockets; transfers still in flight are reported FAILED."""

    def __enter__(self) -> KVReceiver:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_kv_cache(kv_cache: object) -> torch.Tensor:
    """Validate the cache contract: [2, num_layers, num_blocks, block_size, num_kv_heads, head_dim]."""
    if not isinstance(kv_cache, torch.Tensor):
        raise ValueError(f"kv_cache must be a torch.Tensor, got {type(kv_cache).__name__}")
    if kv_cache.dim() != 6 or kv_cache.shape[0] != 2:
        raise ValueError(
            "kv_cache must have shape [2, num_layers, num_blocks, block_size, num_kv_heads, head_dim], "
            f"got {list(kv_cache.shape)}"
        )
    # Blocks are gathered through a flat [2 * num_layers, num_blocks, block_elems] view, which must not copy.
    if not kv_cache.is_contiguous():
        raise ValueError("kv_cache must be contiguous")
    return kv_cache
