"""The messages for one in-flight request, from the inbox loop to the request's task.

A plain deque with one waiter instead of an `asyncio.Queue` plus `asyncio.wait_for` per message: this
is the router's per-token path, and a reader can take every message that is already there in one go
(`get_batch`), so a stream that fell behind is caught up with one SSE chunk instead of one per token.
The request's deadline is one timer per request (not per message) that wakes the reader with
`StreamTimeout`.

With `wake_every` = K > 1 (the router's --stream-interval) a put wakes the reader only once K tokens
are pending, or for a message that must not wait: a request's first token (index 0), its last
message, a failure. Waking the request's task, and the work it then does per message, is a third to
a half of the router's CPU per token (docs/benchmarks.md), so holding the tokens here, not in the
formatter after the task has run, is what makes K save CPU; the client sees the same chunks either
way (one per K tokens, the first and the last at once).
"""

from __future__ import annotations

import asyncio
from collections import deque

from common.wire.messages import RequestFailed, TokenOutput


class StreamTimeout(Exception):
    """The request's deadline passed while waiting for its workers."""


class RequestStream:
    __slots__ = ("_items", "_waiter", "_timer", "_expired", "_loop", "_wake_every", "_pending")

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None, wake_every: int = 1) -> None:
        if isinstance(wake_every, bool) or not isinstance(wake_every, int) or wake_every < 1:
            raise ValueError(f"wake_every must be a positive int, got {wake_every!r}")
        self._items: deque[TokenOutput | RequestFailed] = deque()
        self._wake_every = wake_every
        self._pending = 0  # tokens put since the reader last took the messages
        self._waiter: asyncio.Future | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._expired = False
        # The reader's loop (given, or looked up once: on Python 3.11 every get_running_loop() is a
        # getpid() system call, and a reader waits once per token).
        self._loop = loop

    def put(self, msg: TokenOutput | RequestFailed) -> None:
        self._items.append(msg)
        if self._wake_every > 1 and _may_wait(msg):
            self._pending += len(msg.token_ids)  # type: ignore[union-attr]  # _may_wait: a TokenOutput
            if self._pending < self._wake_every:
                return
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

    async def get_batch(self) -> list[TokenOutput | RequestFailed]:
        """Every message that has arrived, waiting for the first one if there is none yet."""
        await self._wait()
        items = list(self._items)
        self._items.clear()
        self._pending = 0
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


def _may_wait(msg: TokenOutput | RequestFailed) -> bool:
    """A message the reader need not see before more tokens come: a later token of an unfinished request."""
    return isinstance(msg, TokenOutput) and msg.finish_reason is None and msg.index != 0
