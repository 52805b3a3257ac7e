"""Commands to the workers, queued during one event-loop turn and sent together at its end.

A libzmq send wakes the context's I/O thread when it was idle (a write to its mailbox, then its own
socket write): about 20 us on the CPU box for a lone send, against ~1 us for each further send that
finds it already awake. A front admits many requests per loop turn when it is busy, so sending their
commands together saves most of those wakeups; an idle front sends each command one turn later (no
measurable latency). Sends use synchronous shadows of the asyncio sockets with NOBLOCK, so they never
wait, and no future is built per command.

A command that cannot be delivered when the queue is flushed (the worker's queue is full, or the worker
was disconnected since) is logged and handed to `on_undelivered`, which fails a request command's
request so that it is retried elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import zmq
import zmq.asyncio

from common.wire.messages import Message, encode

log = logging.getLogger(__name__)


class CommandOutbox:
    def __init__(self, on_undelivered: Callable[[str, Message], None]) -> None:
        self._senders: dict[str, zmq.Socket] = {}
        self._queue: list[tuple[str, Message, bytes]] = []
        self._on_undelivered = on_undelivered
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, worker_id: str, push: zmq.asyncio.Socket) -> None:
        """Send to `worker_id` through `push` (whose owner closes it)."""
        self._senders[worker_id] = zmq.Socket.shadow(push.underlying)

    def remove(self, worker_id: str) -> None:
        self._senders.pop(worker_id, None)

    def put(self, worker_id: str, msg: Message) -> bool:
        """Queue `msg` (encoded now, so an unencodable one fails here); False: no such worker."""
        if worker_id not in self._senders:
            return False
        data = encode(msg)
        if not self._queue:
            if self._loop is None:  # looked up once: each get_running_loop() is a getpid() on 3.11
                self._loop = asyncio.get_running_loop()
            self._loop.call_soon(self.flush)
        self._queue.append((worker_id, msg, data))
        return True

    def flush(self) -> None:
        """Send everything queued, in order (also called directly before the sockets close)."""
        queue, self._queue = self._queue, []
        for worker_id, msg, data in queue:
            sock = self._senders.get(worker_id)
            try:
                if sock is None:
                    raise zmq.ZMQError(zmq.ENOTCONN, "the worker was disconnected")
                sock.send(data, zmq.NOBLOCK)
            except zmq.ZMQError as e:  # Again: the worker stopped reading and its queue is full
                log.warning("cannot send %s to %s: %s", msg.TYPE, worker_id, e)
                self._on_undelivered(worker_id, msg)
