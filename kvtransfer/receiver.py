"""The receiver half every transport shares: a job table, one DEALER per sender (kvtransfer/dealers.py),
deadlines.

`fetch()` (engine thread) validates, queues a job and wakes the I/O thread through a pipe. The I/O
thread owns every socket: it sends the fetch request, hands replies to the transport subclass
(`_on_reply`), enforces each job's deadline, and reports results through a thread-safe queue.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
import zmq

from common.net.sockets import open_sockets
from common.net.waker import Waker
from common.wire.blocks import check_block_ids
from common.wire.codec import Message, encode
from common.wire.handoff import HandOff, Transport
from common.wire.kv_messages import KVAck, KVBinding, KVError, KVFetch, decode_kv
from common.wire.wire_fields import MessageError

from .base import KVReceiver, TransferResult, TransferStatus, check_kv_cache
from .config import KVTransferConfig, validate_seconds
from .dealers import SenderDealers, send
from .device import CopyStream, record_event
from .jobs import Job, StatusBook
from .layout import CacheLayout
from .verify import VerificationFailed, check_binding

logger = logging.getLogger(__name__)


class ZmqReceiver(KVReceiver):
    transport: ClassVar[Transport]

    def __init__(self, kv_cache: torch.Tensor, config: KVTransferConfig | None = None) -> None:
        self._kv = check_kv_cache(kv_cache)
        self._config = config or KVTransferConfig(transport=self.transport)
        self._layout = CacheLayout.of(kv_cache)
        self._inbox: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._book = StatusBook()
        self._xids = itertools.count(1)
        self._jobs: dict[str, Job] = {}  # I/O thread only
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    # ---- engine thread ----------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None or self._closed:
            raise RuntimeError(f"{type(self).__name__} can be started once")
        self._stream = CopyStream(self._kv.device)
        self._sockets = open_sockets(self._config.curve, f"kv {self.transport} receiver")
        self._waker = Waker()
        self._poller = zmq.Poller()
        self._poller.register(self._waker.fd, zmq.POLLIN)
        self._dealers = SenderDealers(self._sockets, self._poller, self._waker)
        self._start_transport()
        self._thread = threading.Thread(target=self._run, name=f"kv-{self.transport}-receiver", daemon=True)
        self._thread.start()

    def fetch(
        self,
        handoff: HandOff,
        dst_block_ids: list[int],
        timeout_s: float | None = None,
        block_hashes: Sequence[int] | None = None,
    ) -> None:
        if self._thread is None or self._closed:
            raise RuntimeError(f"{type(self).__name__} is not running (call start(), not after close())")
        if not isinstance(handoff, HandOff):
            raise ValueError(f"handoff must be a HandOff, got {type(handoff).__name__}")
        self._book.begin(handoff.request_id)
        timeout = self._config.fetch_timeout_s if timeout_s is None else timeout_s
        xid, now = self._next_xid(), time.monotonic()
        job = Job(handoff, xid, dst_block_ids, 0.0, now)
        job.block_hashes = None if block_hashes is None else list(block_hashes)
        error = self._validate(job, timeout)
        if error:
            self._reject(job, error)
            return
        job.timeout_s = float(timeout)
        job.ready = record_event(self._kv.device)
        self._enqueue(job)

    def _next_xid(self) -> int:
        return next(self._xids)

    def _reject(self, job: Job, error: str) -> None:
        """A fetch that fails its checks: reported FAILED without ever starting."""
        self._finish(job, TransferStatus.FAILED, error)

    def _enqueue(self, job: Job) -> None:
        """Hand a checked fetch to the I/O thread, which sends the fetch request."""
        self._inbox.put(job)
        self._waker.wake()

    def poll(self) -> list[TransferResult]:
        return self._book.drain()

    def status(self, request_id: str) -> TransferStatus | None:
        return self._book.get(request_id)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._stop.set()
            self._waker.wake()
            self._thread.join()
            self._waker.close()
            self._sockets.close()

    def _validate(self, job: Job, timeout: object) -> str | None:
        handoff = job.handoff
        if handoff.transport != self.transport:
            return f"the hand-off is for transport {handoff.transport!r}, not {self.transport!r}"
        try:
            job.dst = check_block_ids("dst_block_ids", job.dst, self._kv.shape[2])
        except ValueError as e:
            return str(e)
        if len(job.dst) != handoff.num_blocks:
            return f"dst_block_ids ({len(job.dst)}) must match the {handoff.num_blocks} blocks published"
        if job.block_hashes is not None and len(job.block_hashes) > len(job.dst):
            return f"block_hashes ({len(job.block_hashes)}) outnumber the blocks ({len(job.dst)})"
        return validate_seconds("timeout_s", timeout) or self._validate_handoff(handoff)

    # ---- I/O thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for sock, _ in self._poller.poll(self._poll_timeout_ms()):
                    if sock == self._waker.fd:
                        self._waker.drain()
                        self._take_inbox()
                        self._dealers.send_posted()
                    else:
                        self._drain(sock)
                self._tick()
                self._expire(time.monotonic())
        except Exception:
            logger.exception("kvtransfer %s receiver: I/O loop crashed", self.transport)
        finally:
            self._shutdown()

    def _poll_timeout_ms(self) -> int:
        wait = self._config.poll_interval_s
        if self._jobs:
            wait = min(wait, min(j.deadline for j in self._jobs.values()) - time.monotonic())
        return max(0, int(wait * 1000))

    def _take_inbox(self) -> None:
        while True:
            try:
                job = self._inbox.get_nowait()
            except queue.Empty:
                return
            try:
                self._begin(job)
            except Exception as e:
                logger.exception("kvtransfer %s receiver: starting %r failed", self.transport, job.request_id)
                self._fail(job, f"receiver error starting the fetch: {e!r}")

    def _begin(self, job: Job) -> None:
        self._jobs[job.request_id] = job
        try:
            job.socket = self._dealers.dealer(job.address)
        except zmq.ZMQError as e:
            self._fail(job, f"cannot connect to sender address {job.address!r}: {e}", notify=False)
            return
        remaining = max(job.deadline - time.monotonic(), 1e-3)
        nonce, layout = job.handoff.nonce, self._layout.to_wire()
        request = KVFetch(job.request_id, job.xid, nonce, layout, remaining, **self._fetch_extra(job))
        if not send(job.socket, [encode(request)]):
            self._fail(job, f"cannot send the fetch request to {job.address}", notify=False)
            return
        self._set_status(job, TransferStatus.TRANSFERRING)

    def _drop_dealer_if_idle(self, address: str) -> None:
        """Close the socket to a sender that just timed out, unless other jobs still use it: a dead
        sender's socket would otherwise keep reconnecting forever."""
        if not any(j.address == address for j in self._jobs.values()):
            self._dealers.drop(address)

    def _drain(self, sock: zmq.Socket) -> None:
        for _ in range(64):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._on_message(sock, frames)

    def _on_message(self, sock: zmq.Socket, frames: list[zmq.Frame]) -> None:
        try:
            msg = decode_kv(frames[0].buffer)
        except MessageError as e:
            logger.debug("kvtransfer receiver: dropping a malformed frame: %s", e)
            return
        rid, xid = getattr(msg, "request_id", None), getattr(msg, "xid", None)
        job = self._jobs.get(rid) if isinstance(rid, str) else None
        if job is None or job.xid != xid or job.socket is not sock:
            return  # a reply to an attempt that already ended, or not for us
        try:
            if isinstance(msg, KVError):
                job.state["sender_error"] = msg
                self._fail(job, f"sender: {msg.error}", notify=False)
            else:
                self._on_reply(job, msg, frames[1:])
        except MessageError as e:
            self._fail(job, f"malformed reply from sender: {e}")
        except VerificationFailed as e:
            self._fail(job, f"verification failed: {e}")
        except Exception as e:
            logger.exception("kvtransfer %s receiver: handling a reply failed", self.transport)
            self._fail(job, f"receiver error: {e!r}")

    def _expire(self, now: float) -> None:
        for job in [j for j in self._jobs.values() if j.deadline <= now]:
            stage = f"{job.progress}/{len(job.dst)} blocks written" if job.progress else "no data yet"
            self._fail(job, f"timed out after {job.timeout_s:g} s waiting for sender {job.address} ({stage})")
            self._drop_dealer_if_idle(job.address)

    def _complete(self, job: Job) -> None:
        """The dst blocks hold the data (copy stream synchronized): ack, then report DONE."""
        send(job.socket, [encode(KVAck(job.request_id, job.xid))])
        self._jobs.pop(job.request_id, None)
        self._finish(job, TransferStatus.DONE, None)

    def _fail(self, job: Job, error: str, notify: bool = True) -> None:
        if notify and job.socket is not None:  # so the sender releases its blocks now, not at lease end
            send(job.socket, [encode(KVError(job.request_id, job.xid, error))])
        self._jobs.pop(job.request_id, None)
        self._on_job_failed(job)
        self._finish(job, TransferStatus.FAILED, error)

    def _set_status(self, job: Job, status: TransferStatus) -> None:
        self._book.set(job.request_id, status)

    def _finish(self, job: Job, status: TransferStatus, error: str | None) -> None:
        self._book.finish(job, status, error)

    def _shutdown(self) -> None:
        for job in list(self._jobs.values()):
            self._fail(job, "receiver closed", notify=False)
        while True:
            try:
                self._fail(self._inbox.get_nowait(), "receiver closed", notify=False)
            except queue.Empty:
                break
        self._shutdown_transport()
        self._dealers.close_all()

    def _check_binding(self, job: Job, binding: KVBinding | None) -> None:
        """Raise VerificationFailed unless the reply is bound to this job's publication and prompt."""
        if self._config.verify:
            check_binding(job.handoff, binding, job.block_hashes, len(job.dst))

    # ---- transport hooks --------------------------------------------------------------------------

    def _start_transport(self) -> None:
        """Transport setup at start() (no network I/O: peers are reached lazily)."""

    def _validate_handoff(self, handoff: HandOff) -> str | None:
        """Why this receiver cannot take the hand-off (its transport's part), or None."""
        return None

    def _fetch_extra(self, job: Job) -> dict[str, Any]:
        """Transport fields of the KVFetch."""
        return {}

    def _on_reply(self, job: Job, msg: Message, frames: list[zmq.Frame]) -> None:
        """A reply of the sender to this attempt (`frames`: the raw frames after its header); raise
        MessageError for one that breaks the protocol, VerificationFailed for one that fails its checks."""
        raise NotImplementedError

    def _on_job_failed(self, job: Job) -> None:
        """A job ended FAILED (its dst blocks must not be written from now on)."""

    def _tick(self) -> None:
        """Called on every loop iteration (transports with helper threads collect their results)."""

    def _shutdown_transport(self) -> None:
        """Release transport resources (on the I/O thread as it exits)."""
