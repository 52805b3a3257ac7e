"""ClientWatch: a client's disconnect cancels the request's task; short requests never start a watcher.
(The real-server test is test_server_process.py's disconnect test.)"""

from __future__ import annotations

import asyncio
import time

import pytest

from router.client_watch import WATCH_AFTER_S, ClientWatch


def _receive_disconnect_after(seconds: float, calls: list[float]):
    async def receive() -> dict:
        calls.append(time.monotonic())
        await asyncio.sleep(seconds)
        return {"type": "http.disconnect"}

    return receive


def test_a_client_that_leaves_cancels_the_request_task_once_watched():
    calls: list[float] = []

    async def request() -> tuple[bool, float]:
        start = time.monotonic()
        watch = ClientWatch(_receive_disconnect_after(0.0, calls))
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            watch.close()
            return watch.disconnected, time.monotonic() - start
        raise AssertionError("not cancelled")

    disconnected, took = asyncio.run(request())
    assert disconnected and len(calls) == 1
    assert WATCH_AFTER_S * 0.9 <= took < 1.0  # seen when the watcher starts, not before, not never


def test_a_request_done_before_the_watch_starts_never_reads_receive():
    calls: list[float] = []

    async def request() -> None:
        watch = ClientWatch(_receive_disconnect_after(0.0, calls))
        await asyncio.sleep(WATCH_AFTER_S / 4)
        watch.close()
        await asyncio.sleep(WATCH_AFTER_S * 2)  # past the start it would have had

    asyncio.run(request())
    assert calls == []


def test_a_closed_watch_does_not_cancel_and_a_cancel_it_caused_is_taken_back():
    calls: list[float] = []

    async def request() -> int:
        watch = ClientWatch(_receive_disconnect_after(0.05, calls))
        with pytest.raises(asyncio.CancelledError):
            await asyncio.sleep(5)
        watch.close()
        task = asyncio.current_task()
        assert task is not None
        await asyncio.sleep(0.01)  # a later await is not cancelled again
        return task.cancelling()

    assert asyncio.run(request()) == 0


def test_outside_a_task_is_refused():
    async def receive() -> dict:
        return {"type": "http.disconnect"}

    async def main() -> BaseException | None:
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[BaseException | None] = loop.create_future()

        def callback() -> None:  # runs in the loop, but in no task
            try:
                ClientWatch(receive)
                outcome.set_result(None)
            except RuntimeError as e:
                outcome.set_result(e)

        loop.call_soon(callback)
        return await outcome

    error = asyncio.run(main())
    assert isinstance(error, RuntimeError) and "task" in str(error)
