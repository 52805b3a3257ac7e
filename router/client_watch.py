"""Notice a client's disconnect while its request runs, and cancel the request's task at once.

ASGI servers tell an application that the client left only through `receive()` returning
`http.disconnect`; writing to a closed connection may succeed silently. One watcher task per request
waits for that message and cancels the task serving the request, whose cleanup then aborts the
request's sequences on their workers. The watcher starts WATCH_AFTER_S after the request: most
requests of a busy front end sooner, and skip the task (its creation, two steps and its
cancellation, ~10 us of a request's ~300 on the CPU box); a client that left before then is seen
when it starts (uvicorn's `receive()` answers `http.disconnect` at once for a closed connection).
"""

from __future__ import annotations

import asyncio

from starlette.types import Receive

# How long a request runs before its disconnect watcher starts (module docstring).
WATCH_AFTER_S = 0.02


class ClientWatch:
    """Must be created inside the task serving the request; `close` it when the answer is complete.
    After a CancelledError, `disconnected` says whether the client's departure caused it."""

    def __init__(self, receive: Receive) -> None:
        loop = asyncio.get_running_loop()  # once: on Python 3.11 each lookup is a getpid() call
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("ClientWatch must be created inside the request's task")
        self._task = task
        self._receive = receive
        self._closed = False
        self.disconnected = False
        self._waiter: asyncio.Future | None = None
        self._start = loop.call_later(WATCH_AFTER_S, self._watch)

    def _watch(self) -> None:
        self._waiter = asyncio.ensure_future(_until_disconnect(self._receive))
        self._waiter.add_done_callback(self._on_done)

    def _on_done(self, waiter: asyncio.Future) -> None:
        if self._closed or waiter.cancelled() or waiter.exception() is not None:
            return
        self.disconnected = True
        self._task.cancel()

    def close(self) -> None:
        """Stop watching. A cancellation this watch caused was handled by now: it is taken back, so
        the task's later awaits (and timeouts) behave as in a task never cancelled."""
        if self._closed:
            return
        self._closed = True
        self._start.cancel()
        if self._waiter is not None:
            self._waiter.cancel()
        if self.disconnected:
            self._task.uncancel()


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
