"""nccl transport: blocks travel by torch.distributed send/recv over a two-rank group per pair.

Control still goes over ZMQ: the receiver's fetch names its pair (a random id; the first fetch on a
pair makes both ends rendezvous through the sender's TCPStore). The sender gathers the blocks into one
contiguous device buffer, replies `KVReady(nbytes)` and queues the send on the pair's thread; the
receiver, on `KVReady`, queues a recv into a buffer of that size on its end of the pair, scatters it
into the dst blocks, synchronizes and acks. The backend is NCCL for CUDA caches and gloo for CPU ones
(which is how the protocol is tested without GPUs). Bytes travel as uint8, so every cache dtype works.

Verification (`verify.py`): `KVReady` carries the binding and the checksums of the blocks served, which the
gather took as it read them (`block_copy.py`: on CUDA one kernel reads each byte once); the receiver
checks the binding on `KVReady` (before queueing its recv), and its scatter of the received buffer checks
the bytes in the same pass: it adds their sums to the negated sent ones on the device, and the job
fails unless every residual is 0 (read back after the synchronization the scatter already had).
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from typing import Any

import torch

from common.wire.codec import Message, encode
from common.wire.handoff import HandOff, NcclStore
from common.wire.kv_messages import KVError, KVFetch, KVReady
from common.wire.wire_fields import MessageError

from .block_copy import scatter_blocks
from .config import WILDCARD_HOSTS
from .device import wait_event
from .dist_pair import PairGroup, close_pairs, connect_store, resolve_backend, serve_store, wait_work
from .jobs import Job
from .publication import FetchRejected, Publication
from .receiver import ZmqReceiver
from .sender import ZmqSender
from .verify import VerificationFailed, check_residuals, unpack_sums

MAX_DEAD_PAIRS = 1024


class NcclSender(ZmqSender):
    transport = "nccl"

    def _start_transport(self) -> None:
        self._backend = resolve_backend(self._config.dist_backend, self._kv.device)
        self._iface = self._advertise_host()
        bind = self._iface if self._config.host in WILDCARD_HOSTS else self._config.host
        self._store = serve_store(bind, self._config.fetch_timeout_s)
        self._pairs: dict[str, PairGroup] = {}
        self._dead_pairs: dict[str, None] = {}  # ordered set, bounded
        self._send_failures: queue.SimpleQueue = queue.SimpleQueue()
        self._retired: list[PairGroup] = []  # closed pairs whose threads may still be tearing down
        self._store_record = NcclStore(self._iface, self._store.port, self._backend)  # type: ignore[arg-type]

    def _handoff_part(self, pub: Publication) -> NcclStore:
        return self._store_record

    def _claim(self, req: KVFetch) -> Publication:
        # The pair comes first: the receiver's end is already waiting to rendezvous, even if this
        # particular fetch is then refused.
        self._drop_pairs(req.drop_pairs)
        self._pair(req.pair)
        return super()._claim(req)

    def _serve(self, ident: bytes, req: KVFetch, pub: Publication) -> None:
        pair = self._pair(req.pair)
        verify = self._config.verify
        read = self._read_blocks(req.request_id, pub, pub.block_ids, to_host=False, checksum=verify)
        if read is None:
            raise FetchRejected(f"request {req.request_id!r} was cancelled at the sender")
        payload = read.blocks.view(-1).view(torch.uint8)
        ready = KVReady(req.request_id, req.xid, payload.numel(), read.sums, pub.binding(self._epoch))
        self._reply(ident, [encode(ready)])
        deadline = time.monotonic() + req.timeout_s
        failure = (ident, req.request_id, req.xid)
        pair.submit(
            lambda group: self._send(pair, group, payload, deadline),
            lambda reason: self._send_failures.put((*failure, reason)),
        )

    def _send(self, pair: PairGroup, group, payload: torch.Tensor, deadline: float) -> None:
        work = group.send([payload], 1, 0)
        wait_work(work, self._backend, deadline, pair.is_broken)

    def _pair(self, pair_id: str | None) -> PairGroup:
        if pair_id is None or not 8 <= len(pair_id) <= 64:
            raise FetchRejected("an nccl fetch must name its pair (an id of 8 to 64 characters)")
        if pair_id in self._dead_pairs:
            raise FetchRejected(f"pair {pair_id} is broken; start a new one", pair_broken=True)
        pair = self._pairs.get(pair_id)
        if pair is None:
            timeout = self._config.fetch_timeout_s
            store = self._store
            pair = PairGroup(pair_id, 0, self._backend, lambda: store, self._iface, timeout).start()
            self._pairs[pair_id] = pair
        return pair

    def _drop_pairs(self, pair_ids: list[str]) -> None:
        """Close pairs the receiver abandoned (their order is lost), freeing their communicators."""
        for pair_id in pair_ids:
            if pair_id in self._pairs:
                self._retire(pair_id, "abandoned by the receiver")

    def _retire(self, pair_id: str, reason: str) -> None:
        pair = self._pairs.pop(pair_id)
        pair.close(reason)
        self._retired = [p for p in self._retired if p.alive] + [pair]
        self._dead_pairs[pair_id] = None
        while len(self._dead_pairs) > MAX_DEAD_PAIRS:
            self._dead_pairs.pop(next(iter(self._dead_pairs)))

    def _tick(self) -> None:
        while True:
            try:
                ident, request_id, xid, reason = self._send_failures.get_nowait()
            except queue.Empty:
                break
            error = f"send failed: {reason}"
            self._leases.fail(request_id, error)
            self._reply(ident, [encode(KVError(request_id, xid, error, pair_broken=True))])
        for pair_id in [p for p, pair in self._pairs.items() if pair.is_broken()]:
            self._retire(pair_id, "broken")

    def _shutdown_transport(self) -> None:
        close_pairs([*self._pairs.values(), *self._retired], "sender closed")
        self._pairs.clear()


class NcclReceiver(ZmqReceiver):
    transport = "nccl"

    def _start_transport(self) -> None:
        self._backend = resolve_backend(self._config.dist_backend, self._kv.device)
        host = self._config.advertise_host or self._config.host
        self._iface = "127.0.0.1" if host in WILDCARD_HOSTS else host
        self._pairs: dict[str, PairGroup] = {}  # sender address -> live pair
        self._abandoned: dict[str, list[str]] = {}  # sender address -> pair ids to tell it to drop
        self._finished_recvs: queue.SimpleQueue[tuple[Job, str | None]] = queue.SimpleQueue()  # (job, error)
        self._write_lock = threading.Lock()  # a recv's scatter vs. the I/O thread failing its job
        self._retired: list[PairGroup] = []  # closed pairs whose threads may still be tearing down

    def _validate_handoff(self, handoff: HandOff) -> str | None:
        assert handoff.nccl is not None  # HandOff sets it exactly for nccl
        if handoff.nccl.backend != self._backend:
            return f"sender uses backend {handoff.nccl.backend!r}, this receiver {self._backend!r}"
        return None

    def _fetch_extra(self, job: Job) -> dict[str, Any]:
        pair = self._pairs.get(job.address)
        if pair is not None and pair.is_broken():
            self._retire_pair(job.address, pair, "broken")
            pair = None
        if pair is None:
            store, timeout = job.handoff.nccl, self._config.fetch_timeout_s
            assert store is not None  # checked by _validate_handoff
            connect = lambda: connect_store(store.host, store.port, timeout)
            pair = PairGroup(uuid.uuid4().hex, 1, self._backend, connect, self._iface, timeout).start()
            self._pairs[job.address] = pair
        job.state["pair"] = pair
        return {"pair": pair.pair_id, "drop_pairs": self._abandoned.pop(job.address, [])}

    def _on_reply(self, job: Job, msg: Message, frames: list) -> None:
        if not isinstance(msg, KVReady) or "ready" in job.state:
            raise MessageError(f"unexpected {msg.TYPE!r} message")
        nbytes = msg.nbytes
        if nbytes != len(job.dst) * self._layout.block_bytes:
            raise MessageError(f"sender will send {nbytes} bytes, expected {len(job.dst)} blocks")
        self._check_binding(job, msg.binding)
        job.state["ready"] = True
        sums = msg.sums
        job.state["pair"].submit(
            lambda group: self._recv(job, group, nbytes, sums),
            lambda reason: self._finished_recvs.put((job, f"recv failed: {reason}")),
        )

    def _recv(self, job: Job, group, nbytes: int, sums: object) -> None:
        pair: PairGroup = job.state["pair"]
        with self._stream.use():
            buf = torch.empty(nbytes, dtype=torch.uint8, device=self._kv.device)
            work = group.recv([buf], 0, 0)
            wait_work(work, self._backend, job.deadline, pair.is_broken)
            blocks = buf.view(self._layout.torch_dtype).view(2 * self._layout.num_layers, len(job.dst), -1)
            try:
                if not self._write(job, blocks, sums):
                    return  # reported FAILED already: the dst blocks may belong to someone else now
            except VerificationFailed as e:
                self._finished_recvs.put((job, f"verification failed: {e}"))
                self._waker.wake()
                return
        job.num_bytes = nbytes
        self._finished_recvs.put((job, None))
        self._waker.wake()

    def _write(self, job: Job, blocks: torch.Tensor, sums: object) -> bool:
        """Scatter received blocks into the job's dst blocks, checking them against the sender's sums
        in the same pass when verifying (a failed check leaves them there: the job fails, and its
        reserved blocks are never committed, so nothing reads them). False if the job had failed."""
        sent = unpack_sums(sums, len(job.dst)) if self._config.verify else None
        device = self._kv.device
        with self._write_lock:
            if job.state.get("failed"):
                return False
            wait_event(job.ready)
            residuals = None if sent is None else sent.neg().to(device)
            scatter_blocks(self._kv, torch.tensor(job.dst, device=device), blocks, residuals)
            self._stream.synchronize()
        if residuals is not None and sent is not None:
            check_residuals(residuals.cpu(), sent)
        return True

    def _tick(self) -> None:
        while True:
            try:
                job, reason = self._finished_recvs.get_nowait()
            except queue.Empty:
                return
            if self._jobs.get(job.request_id) is not job:
                continue
            if reason is None:
                self._complete(job)
            else:
                self._fail(job, reason)

    def _on_job_failed(self, job: Job) -> None:
        with self._write_lock:
            job.state["failed"] = True
        pair: PairGroup | None = job.state.get("pair")
        sender_error: KVError | None = job.state.get("sender_error")
        refused = sender_error is not None and "ready" not in job.state and not sender_error.pair_broken
        if pair is None or refused:
            return  # nothing was queued on the pair for this job: its order is intact
        # The sender may have queued (or still queue) a send this receiver will never match.
        self._retire_pair(job.address, pair, f"transfer {job.request_id!r} failed mid-way")

    def _retire_pair(self, address: str, pair: PairGroup, reason: str) -> None:
        """Close a pair for good and tell its sender, with the next fetch, to drop its end too."""
        if self._pairs.get(address) is pair:
            del self._pairs[address]
        if pair.closed:
            return
        pair.close(reason)
        self._retired = [p for p in self._retired if p.alive] + [pair]
        self._abandoned.setdefault(address, []).append(pair.pair_id)

    def _shutdown_transport(self) -> None:
        close_pairs([*self._pairs.values(), *self._retired], "receiver closed")
        self._pairs.clear()
