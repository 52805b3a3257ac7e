"""Waiting in asyncio until a ZMQ socket has a message, for the price of one future per wait.

`await sock.poll()` on a zmq.asyncio socket builds a poller, registers the socket's file descriptor with
the event loop, and unregisters it again, on every call: on the CPU box a loopback round trip through
a thread echoing the message took 315-330 us that way against 235-252 us with the descriptor
registered once, and 400-440 against 270-300 us of process CPU (/tmp probe, 2026-12-05; the router's
inbox waits once per message when it is idle). `Readable` registers the descriptor once.

ZMQ's descriptor is edge-triggered in meaning: it says "look at ZMQ_EVENTS", not "a message is there",
and reading ZMQ_EVENTS (or receiving) is what re-arms it. So `wait` looks at ZMQ_EVENTS before every
sleep, and the loop's callback only wakes the waiter, which looks again.
"""

from __future__ import annotations

import asyncio
from typing import cast

import zmq


class Readable:
    """Readiness of one socket (`sock`, which the caller keeps open and reads with NOBLOCK) for one
    waiter at a time. `open` inside the running loop before `wait`; `close` before closing the socket."""

    def __init__(self, sock: zmq.Socket) -> None:
        self._sock = sock
        self._fd: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiter: asyncio.Future[None] | None = None

    def open(self) -> None:
        self._loop = asyncio.get_running_loop()
        fd = self._fd = cast(int, self._sock.getsockopt(zmq.FD))
        self._loop.add_reader(fd, self._wake)

    def close(self) -> None:
        if self._loop is not None and self._fd is not None:
            self._loop.remove_reader(self._fd)
        self._fd = None
        if self._waiter is not None and not self._waiter.done():
            self._waiter.cancel()

    async def wait(self) -> None:
        """Return once a message can be received without blocking (at once if one can now)."""
        if self._loop is None:
            raise RuntimeError("Readable.open() first")
        while not cast(int, self._sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
