"""The sender half every transport shares: publications with leases, and a ZMQ ROUTER control loop.

The background thread owns the ROUTER socket. It answers fetch requests (the transport subclass moves
the bytes in `_serve`), turns acks and receiver errors into releases, and expires leases. The engine's
thread only touches the publication table (`Leases`, kvtransfer/leases.py, under its lock).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import ClassVar

import torch
import zmq

from common.net.addresses import tcp_endpoint
from common.net.sockets import SocketOptions, last_endpoint, open_sockets
from common.wire.blocks import check_block_ids
from common.wire.codec import encode
from common.wire.handoff import HandOff, IpcExport, NcclStore, Transport
from common.wire.kv_messages import KVAck, KVCopied, KVError, KVFetch, decode_kv
from common.wire.wire_fields import MessageError

from .base import KVSender, Release, TransferStatus, check_kv_cache
from .block_copy import gather_blocks
from .config import WILDCARD_HOSTS, KVTransferConfig, validate_seconds
from .device import CopyStream, host_buffer, record_event, wait_event
from .layout import CacheLayout
from .leases import Leases
from .publication import FetchRejected, Publication, ReadBlocks
from .verify import new_token, pack_sums

logger = logging.getLogger(__name__)

# ROUTER_MANDATORY: unroutable replies raise instead of vanishing; SNDHWM 0: a full pipe would otherwise
# drop data frames silently; IPV6 on even for IPv4 hosts: a wildcard bind then takes both families.
ROUTER_OPTIONS = SocketOptions(send_hwm=0, ipv6=True, extra={zmq.ROUTER_MANDATORY: 1})


class ZmqSender(KVSender):
    transport: ClassVar[Transport]

    def __init__(self, kv_cache: torch.Tensor, config: KVTransferConfig | None = None) -> None:
        self._kv = check_kv_cache(kv_cache)
        self._config = config or KVTransferConfig(transport=self.transport)
        self._layout = CacheLayout.of(kv_cache)
        self._leases = Leases()
        self._read_lock = threading.Lock()  # held while blocks are read, so cancel() can wait it out
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._address: str | None = None  # the ROUTER's tcp://host:port, known after start()
        self._closed = False
        self._epoch = 0  # drawn at start(): each started sender is a new epoch

    # ---- engine thread ----------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None or self._closed:
            raise RuntimeError(f"{type(self).__name__} can be started once")
        self._stream = CopyStream(self._kv.device)
        self._sockets = open_sockets(self._config.curve, f"kv {self.transport} sender")
        self._epoch = new_token()
        try:
            port = self._bind()
            self._address = tcp_endpoint(self._advertise_host(), port)
            self._start_transport()
        except Exception:
            self._sockets.close()
            raise
        self._thread = threading.Thread(target=self._run, name=f"kv-{self.transport}-sender", daemon=True)
        self._thread.start()

    def _bind(self) -> str:
        """Bind the ROUTER on an ephemeral port of the configured interface; returns the port."""
        self._sock = self._sockets.bind(zmq.ROUTER, self._config.host, options=ROUTER_OPTIONS)
        return last_endpoint(self._sock).rsplit(":", 1)[1]

    @property
    def address(self) -> str:
        """Where receivers reach this sender's control socket (tcp://host:port), after `start()`."""
        if self._address is None:
            raise RuntimeError("the address is known only after start()")
        return self._address

    def publish(
        self,
        request_id: str,
        src_block_ids: list[int],
        lease_s: float | None = None,
        block_hashes: Sequence[int] = (),
    ) -> HandOff:
        self._check_running()
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty str, got {request_id!r}")
        ids = check_block_ids("src_block_ids", src_block_ids, self._kv.shape[2])
        lease = self._config.lease_s if lease_s is None else lease_s
        error = validate_seconds("lease_s", lease)
        if error:
            raise ValueError(error)
        if len(block_hashes) > len(ids):
            raise ValueError(f"block_hashes ({len(block_hashes)}) outnumber src_block_ids ({len(ids)})")
        ready = record_event(self._kv.device)
        hashes = [*block_hashes, *([None] * (len(ids) - len(block_hashes)))]
        pub = Publication(ids, lease, time.monotonic() + lease, ready, new_token(), hashes)
        self._leases.add(request_id, pub)
        return self._handoff(request_id, pub)

    def cancel(self, request_id: str) -> bool:
        removed = self._leases.remove(request_id)
        with self._read_lock:  # a gather of these blocks may be running: let it finish first
            pass
        return removed

    def poll_released(self) -> list[Release]:
        return self._leases.poll_released()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._sockets.close()

    def _check_running(self) -> None:
        if self._thread is None or self._closed:
            raise RuntimeError(f"{type(self).__name__} is not running (call start(), not after close())")

    def _advertise_host(self) -> str:
        if self._config.advertise_host:
            return self._config.advertise_host
        if self._config.host in WILDCARD_HOSTS:
            import socket

            return socket.gethostname()
        return self._config.host

    # ---- I/O thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poll_ms = int(self._config.poll_interval_s * 1000)
        try:
            while not self._stop.is_set():
                if poller.poll(poll_ms):
                    self._drain()
                self._leases.expire(time.monotonic())
                self._tick()
        finally:
            self._sock.close(linger=0)
            self._shutdown_transport()

    def _drain(self) -> None:
        for _ in range(64):  # bounded, so lease expiry keeps running under a flood of messages
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                self._dispatch(frames)
            except Exception:  # the loop must survive anything a peer sends
                logger.exception("kvtransfer %s sender: failed to handle a message", self.transport)

    def _dispatch(self, frames: list[bytes]) -> None:
        if len(frames) < 2:
            return
        try:
            msg = decode_kv(frames[1])
        except MessageError as e:
            logger.debug("kvtransfer sender: dropping a malformed frame: %s", e)
            return
        if isinstance(msg, KVFetch):
            self._on_fetch(frames[0], msg)
        elif isinstance(msg, KVAck):
            self._leases.end(msg.request_id, msg.xid, TransferStatus.DONE, None)
        elif isinstance(msg, KVCopied):
            self._leases.end_unclaimed(msg.request_ids, TransferStatus.DONE, None)
        elif isinstance(msg, KVError):
            error = f"receiver reported: {msg.error!r}"
            self._leases.end(msg.request_id, msg.xid, TransferStatus.FAILED, error)

    def _on_fetch(self, ident: bytes, req: KVFetch) -> None:
        try:
            pub = self._claim(req)
            self._serve(ident, req, pub)
        except FetchRejected as e:
            self._reply(ident, [encode(KVError(req.request_id, req.xid, str(e), e.pair_broken))])
        except Exception as e:
            logger.exception("kvtransfer %s sender: serving %r failed", self.transport, req.request_id)
            self._leases.fail(req.request_id, f"sender error: {e!r}")
            self._reply(ident, [encode(KVError(req.request_id, req.xid, f"sender error: {e!r}"))])

    def _claim(self, req: KVFetch) -> Publication:
        """The publication `req` names (request id and nonce), with its lease stretched over the
        receiver's deadline."""
        try:
            layout = CacheLayout.from_wire(req.layout)
        except ValueError as e:
            raise FetchRejected(f"fetch: {e}") from None
        return self._leases.claim(req, layout.mismatch(self._layout))

    def _read_blocks(
        self, request_id: str, pub: Publication, index: list[int], to_host: bool, checksum: bool = False
    ) -> ReadBlocks | None:
        """Gather blocks `index` of a live publication into one contiguous tensor (host memory if
        `to_host`), with the checksums the gather took of them if `checksum`; None if the publication was
        cancelled meanwhile. Synchronous: the blocks are free to reuse once this returns."""
        with self._read_lock:
            if not self._leases.is_live(request_id, pub):
                return None
            wait_event(pub.ready)
            with self._stream.use():
                device = self._kv.device
                sums = torch.zeros(len(index), dtype=torch.int64, device=device) if checksum else None
                blocks = gather_blocks(self._kv, torch.tensor(index, device=device), sums)
                if to_host and blocks.is_cuda:
                    staged = host_buffer(blocks.shape, blocks.dtype, pinned=True)
                    blocks = staged.copy_(blocks, non_blocking=True)
                self._stream.synchronize()
                return ReadBlocks(blocks, None if sums is None else pack_sums(sums))

    def _reply(self, ident: bytes, frames: list, copy: bool = True) -> bool:
        try:
            self._sock.send_multipart([ident, *frames], flags=zmq.NOBLOCK, copy=copy)
            return True
        except zmq.ZMQError as e:  # EHOSTUNREACH: the receiver disconnected
            logger.debug("kvtransfer sender: reply not delivered: %s", e)
            return False

    # ---- transport hooks --------------------------------------------------------------------------

    def _start_transport(self) -> None:
        """Transport setup at start(), after the control socket is bound."""

    def _handoff(self, request_id: str, pub: Publication) -> HandOff:
        """The hand-off a notice for this publication carries."""
        part = self._handoff_part(pub)
        ipc = part if isinstance(part, IpcExport) else None
        nccl = part if isinstance(part, NcclStore) else None
        count = len(pub.block_ids)
        return HandOff(self.transport, self.address, request_id, pub.nonce, self._epoch, count, ipc, nccl)

    def _handoff_part(self, pub: Publication) -> IpcExport | NcclStore | None:
        """The transport's own part of a publication's hand-off (`HandOff.ipc` / `HandOff.nccl`)."""
        return None

    def _serve(self, ident: bytes, req: KVFetch, pub: Publication) -> None:
        """Move the publication's blocks to the receiver `ident`, its transport's way."""
        raise NotImplementedError

    def _tick(self) -> None:
        """Called on every loop iteration (transports with helper threads collect their results)."""

    def _shutdown_transport(self) -> None:
        """Release transport resources (runs on the I/O thread as it exits)."""
