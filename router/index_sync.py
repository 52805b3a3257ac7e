"""Keeps the router's PrefixIndex fed from the workers' cache events (the protocol is in
docs/protocol.md).

Owns one SUB socket and one receive task per events address a worker registers (prefill and mixed
workers publish cache events; any worker that gives an events address is subscribed, whatever its
role), and the snapshot requests still unanswered. A gap in a worker's event sequence numbers, or a
worker that (re)joins, asks that worker for a snapshot; an unanswered ask is repeated while the
worker stays live. The ClusterClient decides when a worker joins or leaves; this class only keeps
the index in step with what the worker says it holds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import zmq
import zmq.asyncio

from common.net.sockets import Sockets
from common.wire.cache_messages import KVEventBatch, Snapshot, SnapshotRequest
from common.wire.messages import Message, MessageError, decode
from router.prefix_index import IndexUpdate, PrefixIndex
from router.worker_registry import WorkerRegistry, WorkerState

log = logging.getLogger(__name__)


class IndexSync:
    def __init__(
        self,
        index: PrefixIndex,
        registry: WorkerRegistry,
        send: Callable[[str, Message], Awaitable[bool]],
        reply_addr: Callable[[], str | None],
        clock: Callable[[], float],
        retry_interval: float,
    ) -> None:
        self._index = index
        self._registry = registry
        self._send = send
        self._reply_addr = reply_addr  # the router's inbox, where snapshots come back
        self._clock = clock
        self._retry_interval = retry_interval
        self._events: dict[str, tuple[zmq.asyncio.Socket, asyncio.Task]] = {}
        self._snapshot_asked: dict[str, float] = {}

    @property
    def tasks(self) -> list[asyncio.Task]:
        """The per-worker receive tasks (for a clean stop)."""
        return [task for _, task in self._events.values()]

    def subscribe(self, sockets: Sockets[zmq.asyncio.Socket], worker_id: str, events_addr: str) -> None:
        sub = sockets.dial(zmq.SUB, events_addr)
        self._index.add_worker(worker_id)
        self._events[worker_id] = (sub, asyncio.create_task(self._events_loop(worker_id, sub)))

    def unsubscribe(self, worker_id: str) -> None:
        entry = self._events.pop(worker_id, None)
        if entry is not None:
            entry[1].cancel()
            entry[0].close(linger=0)
        self._index.remove_worker(worker_id)
        self._snapshot_asked.pop(worker_id, None)

    async def refresh(self, worker_id: str) -> None:
        """Forget what the index holds for the worker and ask it for a snapshot."""
        self._index.reset_worker(worker_id)
        await self._ask_snapshot(worker_id)

    async def on_snapshot(self, msg: Snapshot) -> None:
        if self._index.apply_snapshot(msg) is IndexUpdate.NEEDS_SNAPSHOT:
            await self._ask_snapshot(msg.worker_id)
        elif not self._index.awaiting_snapshot(msg.worker_id):
            self._snapshot_asked.pop(msg.worker_id, None)

    async def retry_snapshots(self, now: float) -> None:
        """Re-ask snapshots that went unanswered for longer than the retry interval."""
        for worker_id, asked_at in list(self._snapshot_asked.items()):
            if not self._index.awaiting_snapshot(worker_id):
                del self._snapshot_asked[worker_id]
            elif now - asked_at > self._retry_interval and self._is_live(worker_id):
                await self._ask_snapshot(worker_id)

    async def _events_loop(self, worker_id: str, sub: zmq.asyncio.Socket) -> None:
        while True:
            data = await sub.recv()
            try:
                batch = decode(data)
            except MessageError as e:
                log.warning("dropping malformed event from %s: %s", worker_id, e)
                continue
            if not isinstance(batch, KVEventBatch) or batch.worker_id != worker_id:
                log.warning("dropping unexpected %s on %s's event socket", batch.TYPE, worker_id)
                continue
            if self._index.apply_batch(batch) is IndexUpdate.NEEDS_SNAPSHOT:
                log.info("event gap from %s at seq %d: asking for a snapshot", worker_id, batch.seq)
                await self._ask_snapshot(worker_id)

    async def _ask_snapshot(self, worker_id: str) -> None:
        self._snapshot_asked[worker_id] = self._clock()
        await self._send(worker_id, SnapshotRequest(worker_id, self._reply_addr()))

    def _is_live(self, worker_id: str) -> bool:
        info = self._registry.get(worker_id)
        return info is not None and info.state is WorkerState.LIVE
