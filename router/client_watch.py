"""Notice a client's disconnect while its request runs, and cancel the request's task at once.

ASGI servers tell an application that the client left only through `receive()` returning
`http.disconnect`; writing to a closed connection may succeed silently. One watcher task per request
waits for that message and cancels the task serving the request, whose cleanup then aborts the
request's sequences on their workers.
"""

from __future__ import annotations

import asyncio

from starlette.types import Receive


class ClientWatch:
    """Must be created inside the task serving the request; `close` it when the answer is complete.
    After a CancelledError, `disconnected` says whether the client's departure caused it."""

    def __init__(self, receive: Receive) -> None:
        task = asyncio.current_task()
        assert task is not None  # constructed by request code, which runs in a task
        self._task = task
        self._closed = False
        self.disconnected = False
        self._waiter = asyncio.ensure_future(_until_disconnect(receive))
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
        self._waiter.cancel()
        if self.disconnected:
            self._task.uncancel()


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
