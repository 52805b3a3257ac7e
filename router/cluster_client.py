"""The router's worker-facing side: ZMQ sockets in asyncio (the protocol is in docs/protocol.md).

Owns: the inbox (one PULL socket every worker pushes to, read by router/inbox_drain.py), one PUSH
socket per registered worker's command address, and the per-request streams that TokenOutput /
RequestFailed messages are routed to by request_id. It keeps the WorkerRegistry current, and the
PrefixIndex through IndexSync (router/index_sync.py: the event subscriptions and snapshots); it never
decides where a request goes (that is the lifecycle's job).

KV path probes (router/kv_probes.py): when a prefill worker and a decode target are both live and
their pair has not been measured, it sends the prefill worker a KVProbeRequest; the KVProbeResult
comes back on the inbox and is logged, recorded and fed to the live rates.

Failure handling: a worker that goes silent is marked DOWN, its cached hashes are dropped from the
index, and every request still depending on it gets a synthetic retryable RequestFailed. A worker that
comes back (heartbeats again, or re-registers) is asked for a snapshot before its hashes count again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import zmq
import zmq.asyncio

from common.net.sockets import SocketOptions, Sockets, last_endpoint, open_async_sockets
from common.wire.cache_messages import Snapshot
from common.wire.messages import (
    Message,
    MessageError,
    RequestFailed,
    Shutdown,
    TokenBatch,
    TokenOutput,
    WorkerHeartbeat,
    WorkerRegister,
    WorkRequest,
    decode,
)
from common.wire.probe_messages import KVProbeResult
from router.command_outbox import CommandOutbox
from router.config import RouterConfig
from router.inbox_drain import drain_inbox
from router.index_sync import IndexSync
from router.kv_probes import KVProbes, PairProber
from router.live_rates import LiveRates
from router.prefix_index import PrefixIndex
from router.request_stream import RequestStream
from router.worker_registry import HeartbeatOutcome, RegistrationOutcome, WorkerRegistry

log = logging.getLogger(__name__)
# Queued commands per worker before sends fail fast instead of blocking the router.
COMMAND_OPTIONS = SocketOptions(send_hwm=100_000)
# The worker -> router messages of the per-token path, decoded without per-field checks: they come from
# registered workers (checked below before they count), which built them through the validating
# constructor (see common/wire/codec.py). Everything else on the inbox is decoded in full.
TRUSTED_INBOX_TYPES = frozenset({TokenOutput, TokenBatch})


class ClusterClient:
    def __init__(
        self,
        config: RouterConfig,
        registry: WorkerRegistry,
        index: PrefixIndex,
        clock: Callable[[], float] = time.monotonic,
        rates: LiveRates | None = None,
        probes: KVProbes | None = None,
    ) -> None:
        self._config = config
        self.registry = registry
        self.index = index
        self.pairs = PairProber(
            probes or KVProbes(num_bytes=0),
            registry,
            rates or LiveRates(),
            self.send,
            lambda: self.inbox_addr,
        )
        self._clock = clock
        self._sockets: Sockets[zmq.asyncio.Socket] | None = None
        self._inbox: zmq.asyncio.Socket | None = None
        self._commands: dict[str, zmq.asyncio.Socket] = {}
        self._outbox = CommandOutbox(self._undelivered)
        self._sync = IndexSync(
            index, registry, self.send, lambda: self.inbox_addr, clock, config.snapshot_retry_interval
        )
        self._streams: dict[str, RequestStream] = {}
        self._tasks: list[asyncio.Task] = []
        self.inbox_addr: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> str:
        """Bind the inbox and start the receive and liveness loops; returns the inbox address."""
        self._loop = asyncio.get_running_loop()  # the streams' (looked up here, not per request)
        self._sockets = open_async_sockets(self._config.curve, "router")
        if self._config.curve is None:
            log.warning("no CURVE keys: any process that reaches the inbox can register as a worker")
        self._inbox = self._sockets.bind(zmq.PULL, self._config.inbox_host, self._config.inbox_port)
        self.inbox_addr = last_endpoint(self._inbox)
        inbox = asyncio.create_task(drain_inbox(self._inbox, self._take))
        self._tasks = [inbox, asyncio.create_task(self._liveness_loop())]
        log.info("router inbox listening on %s", self.inbox_addr)
        return self.inbox_addr

    async def stop(self) -> None:
        tasks = self._tasks + self._sync.tasks
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._outbox.flush()
        for worker_id in list(self._commands):
            self._disconnect(worker_id)
        if self._sockets is not None:
            self._sockets.close()
            self._sockets = None

    # ---- requests ------------------------------------------------------------------------------

    def open_stream(self, request_id: str, wake_every: int = 1) -> RequestStream:
        """The request's message stream; `wake_every`: see RequestStream."""
        stream = self._streams[request_id] = RequestStream(self._loop, wake_every)
        return stream

    def close_stream(self, request_id: str) -> None:
        self._streams.pop(request_id, None)

    async def send(self, worker_id: str, msg: Message) -> bool:
        """Queue a command for a worker without blocking; it goes out at the end of this event-loop
        turn (router/command_outbox.py). False: no such worker. A request command that turns out to
        be undeliverable fails its request (retryable) through the request's stream."""
        return self._outbox.put(worker_id, msg)

    def _undelivered(self, worker_id: str, msg: Message) -> None:
        if isinstance(msg, WorkRequest):
            stream = self._streams.get(msg.request_id)
            if stream is not None:
                stream.put(RequestFailed(msg.request_id, worker_id, "cannot reach worker", True))

    async def shutdown_workers(self, reason: str = "router shutting down") -> int:
        """Ask every registered worker to exit (for launchers); returns how many were told."""
        told = 0
        for worker_id in list(self._commands):
            told += await self.send(worker_id, Shutdown(reason))
        self._outbox.flush()  # now: a launcher may stop the router next
        return told

    # ---- inbox ---------------------------------------------------------------------------------

    async def _take(self, data: bytes) -> None:
        try:
            msg = decode(data, TRUSTED_INBOX_TYPES)
        except MessageError as e:
            log.warning("dropping malformed inbox message: %s", e)
            return
        try:
            if type(msg) is TokenBatch:  # the hot path: one message per decode step
                if self.registry.get(msg.worker_id) is not None:
                    for row in msg.outputs():
                        self._deliver(row)
                else:
                    log.warning("dropping a token batch from unknown worker %r", msg.worker_id)
            elif type(msg) is TokenOutput:
                self._route(msg)  # no coroutine per token
            else:
                await self._handle(msg)
        except Exception:  # one bad message must never stop the router's inbox
            log.exception("error handling %s", msg.TYPE)

    def _route(self, msg: TokenOutput | RequestFailed) -> None:
        if self.registry.get(msg.worker_id) is None:  # only registered workers speak for requests
            log.warning("dropping %s for %s from unknown worker %r", msg.TYPE, msg.request_id, msg.worker_id)
            return
        self._deliver(msg)

    def _deliver(self, msg: TokenOutput | RequestFailed) -> None:
        stream = self._streams.get(msg.request_id)
        if stream is not None:  # else: the request already ended (aborted); late tokens are dropped
            stream.put(msg)

    async def _handle(self, msg: Message) -> None:
        if isinstance(msg, TokenOutput | RequestFailed):
            self._route(msg)
        elif isinstance(msg, WorkerHeartbeat):
            outcome = self.registry.heartbeat(msg, self._clock())
            if outcome is HeartbeatOutcome.REVIVED:
                log.info("worker %s is back", msg.worker_id)
                await self._sync.refresh(msg.worker_id)
        elif isinstance(msg, WorkerRegister):
            await self._on_register(msg)
        elif isinstance(msg, KVProbeResult):
            self.pairs.on_result(msg, self._clock())
        elif isinstance(msg, Snapshot):
            await self._sync.on_snapshot(msg)
        else:
            log.warning("unexpected %s on the inbox", msg.TYPE)

    async def _on_register(self, reg: WorkerRegister) -> None:
        result = self.registry.register(reg, self._clock())
        if result.outcome is RegistrationOutcome.REJECTED:
            log.error(
                "rejected worker %s (%s@%s pid %d): %s",
                reg.worker_id,
                reg.role,
                reg.host,
                reg.pid,
                result.reason,
            )
            return
        if result.outcome is RegistrationOutcome.REFRESHED:
            return
        if result.outcome is RegistrationOutcome.REPLACED:
            log.warning("worker %s restarted (worker process pid %d)", reg.worker_id, reg.pid)
            self._disconnect(reg.worker_id)
            self._fail_requests_on(reg.worker_id, "worker restarted")
        self._connect(reg)
        role, worker_id = reg.role, reg.worker_id
        log.info("registered %s worker %s at %s (worker process pid %d)", role, worker_id, reg.host, reg.pid)
        self.pairs.probes.forget_worker(reg.worker_id)
        if reg.events_addr is not None:
            await self._sync.refresh(reg.worker_id)
        await self.pairs.tick(self._clock())

    # ---- worker sockets ------------------------------------------------------------------------

    def _connect(self, reg: WorkerRegister) -> None:
        assert self._sockets is not None, "start() first"
        push = self._commands[reg.worker_id] = self._sockets.dial(zmq.PUSH, reg.command_addr, COMMAND_OPTIONS)
        self._outbox.add(reg.worker_id, push)
        if reg.events_addr is not None:
            self._sync.subscribe(self._sockets, reg.worker_id, reg.events_addr)

    def _disconnect(self, worker_id: str) -> None:
        self._outbox.remove(worker_id)
        push = self._commands.pop(worker_id, None)
        if push is not None:
            push.close(linger=0)
        self._sync.unsubscribe(worker_id)

    # ---- liveness ------------------------------------------------------------------------------

    async def _liveness_loop(self) -> None:
        interval = min(self._config.heartbeat_timeout / 4, 0.5)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.check_liveness()
            except Exception:
                log.exception("liveness check failed")

    async def check_liveness(self) -> None:
        """Mark silent workers down and re-ask snapshots that went unanswered."""
        now = self._clock()
        for worker_id in self.registry.sweep(now):
            log.warning(
                "worker %s missed heartbeats for %.1fs: down", worker_id, self.registry.heartbeat_timeout
            )
            self.index.reset_worker(worker_id)
            self._fail_requests_on(worker_id, "worker stopped responding")
        await self._sync.retry_snapshots(now)
        await self.pairs.tick(now)

    def _fail_requests_on(self, worker_id: str, reason: str) -> None:
        for request_id in self.registry.loads.requests_on(worker_id):
            stream = self._streams.get(request_id)
            if stream is not None:
                stream.put(RequestFailed(request_id, worker_id, reason, retryable=True))
