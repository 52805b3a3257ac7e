"""Receiver-side bookkeeping: one `Job` per fetch attempt, and the thread-safe `StatusBook` that the
engine's thread reads (`status`, `poll`) while the I/O thread writes it."""

from __future__ import annotations

import queue
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch
import zmq

from common.wire.handoff import HandOff

from .base import TransferResult, TransferStatus

STATUS_HISTORY = 4096  # finished requests whose status() is still remembered


@dataclass(eq=False)
class Job:
    handoff: HandOff  # the publication fetched
    xid: int  # this attempt's number: replies to an earlier attempt of the same request are stale
    dst: list[int]
    timeout_s: float
    started: float
    ready: torch.cuda.Event | None = None  # engine work queued on the dst blocks before fetch()
    block_hashes: list[int] | None = None  # the prompt's chain the served blocks must match
    socket: zmq.Socket | None = None
    num_bytes: int = 0
    progress: int = 0  # blocks written so far
    state: dict[str, Any] = field(default_factory=dict)  # transport-specific

    @property
    def deadline(self) -> float:
        return self.started + self.timeout_s

    @property
    def request_id(self) -> str:
        return self.handoff.request_id

    @property
    def address(self) -> str:
        return self.handoff.address


class StatusBook:
    """Statuses of in-flight requests, a bounded memory of finished ones, and the results queue."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: dict[str, TransferStatus] = {}
        self._finished: OrderedDict[str, TransferStatus] = OrderedDict()
        self._results: queue.SimpleQueue[TransferResult] = queue.SimpleQueue()

    def begin(self, request_id: str) -> None:
        """Mark a new fetch PENDING; ValueError if one is already in flight for this request."""
        with self._lock:
            if request_id in self._active:
                raise ValueError(f"request_id {request_id!r} already has a transfer in flight")
            self._active[request_id] = TransferStatus.PENDING
            self._finished.pop(request_id, None)

    def set(self, request_id: str, status: TransferStatus) -> None:
        with self._lock:
            if request_id in self._active:
                self._active[request_id] = status

    def get(self, request_id: str) -> TransferStatus | None:
        with self._lock:
            return self._active.get(request_id) or self._finished.get(request_id)

    def finish(self, job: Job, status: TransferStatus, error: str | None) -> None:
        result = TransferResult(job.request_id, status, job.num_bytes, time.monotonic() - job.started, error)
        with self._lock:
            self._active.pop(job.request_id, None)
            self._finished[job.request_id] = status
            while len(self._finished) > STATUS_HISTORY:
                self._finished.popitem(last=False)
        self._results.put(result)

    def drain(self) -> list[TransferResult]:
        out = []
        while True:
            try:
                out.append(self._results.get_nowait())
            except queue.Empty:
                return out
