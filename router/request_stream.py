"""The messages for one in-flight request, from the inbox loop to the request's task.

A plain deque with one waiter instead of an `asyncio.Queue` plus `asyncio.wait_for` per message: this
is the router's per-token path, and a reader can take every message that is already there in one go
(`get_batch`), so a stream that fell behind is caught up with one SSE chunk instead of one per token.
The request's deadline is one timer per request (not per message) that wakes the reader with
`StreamTimeout`.
"""

from __future__ import annotations

import asyncio
from collections import deque

from common.wire.messages import RequestFailed, TokenOutput


class StreamTimeout(Exception):
    """The request's deadline passed while waiting for its workers."""


class RequestStream:
    __slots__ = ("_items", "_waiter", "_timer", "_expired", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._items: deque[TokenOutput | RequestFailed] = deque()
        self._waiter: asyncio.Future | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._expired = False
        # The reader's loop (given, or looked up once: on Python 3.11 every get_running_loop() is a
        # getpid() system call, and a reader waits once per token).
        self._loop = loop

    def put(self, msg: TokenOutput | RequestFailed) -> None:
        self._items.append(msg)
        self._wake()

    def empty(self) -> bool:
        return not self._items

    def expire_after(self, seconds: float) -> None:
        """Make readers raise StreamTimeout once `seconds` have passed."""
        self._timer = self._running_loop().call_later(max(seconds, 0.0), self._expire)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def get(self) -> TokenOutput | RequestFailed:
        await self._wait()
        return self._items.popleft()

    async def get_batch(self) -> list[TokenOutput | RequestFailed]:
        """Every message that has arrived, waiting for the first one if there is none yet."""
        await self._wait()
        items = list(self._items)
        self._items.clear()
        return items

    async def _wait(self) -> None:
        while True:
            if self._expired:  # a hard deadline: even a stream still producing ends there
                raise StreamTimeout()
            if self._items:
                return
            self._waiter = self._running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _expire(self) -> None:
        self._expired = True
        self._timer = None
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
