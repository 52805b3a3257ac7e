"""`InflightBound.enter`: a request past the bound waits (first come, first served) for a place up to
its admission wait, is admitted the moment a place frees, and gets its rejection counted otherwise."""

from __future__ import annotations

import asyncio

import pytest

from router.config import RouterConfig
from router.inflight import InflightBound
from router.router_metrics import RouterMetrics


def rejected(bound: InflightBound) -> float:
    return bound._metrics.requests.value(status="rejected")  # noqa: SLF001


async def full(limit: int) -> InflightBound:
    """A bound whose every place is taken (no one waiting yet)."""
    bound = InflightBound(limit, RouterMetrics())
    for _ in range(limit):
        assert await bound.enter(0.0)
    return bound


def test_room_admits_at_once_and_no_wait_rejects_at_once() -> None:
    async def run() -> None:
        bound = InflightBound(1, RouterMetrics())
        assert await bound.enter(5.0) and bound.count == 1
        assert not await bound.enter(0.0) and rejected(bound) == 1

    asyncio.run(run())


def test_a_waiter_is_admitted_when_a_place_frees_first_come_first_served() -> None:
    async def run() -> None:
        bound = await full(2)
        order: list[str] = []

        async def wait(name: str) -> None:
            if await bound.enter(5.0):
                order.append(name)

        first, second = asyncio.create_task(wait("a")), asyncio.create_task(wait("b"))
        await asyncio.sleep(0.05)
        assert order == [] and bound.count == 2
        bound.leave()
        await asyncio.sleep(0.05)
        assert order == ["a"] and bound.count == 2
        bound.leave()
        await asyncio.gather(first, second)
        assert order == ["a", "b"] and rejected(bound) == 0

    asyncio.run(run())


def test_a_newcomer_does_not_jump_the_queue() -> None:
    async def run() -> None:
        bound = await full(2)
        waiter = asyncio.create_task(bound.enter(5.0))
        await asyncio.sleep(0.02)
        bound.leave()  # the waiter is woken; a request arriving before it runs must not take its place
        assert not bound.try_enter() and rejected(bound) == 1
        assert await waiter and bound.count == 2

    asyncio.run(run())


def test_a_wait_that_sees_no_place_ends_in_a_rejection() -> None:
    async def run() -> None:
        bound = await full(1)
        loop = asyncio.get_running_loop()
        began = loop.time()
        assert not await bound.enter(0.1)
        assert loop.time() - began >= 0.1 and rejected(bound) == 1 and bound.count == 1
        assert not bound._waiting  # noqa: SLF001 - nothing left queued

    asyncio.run(run())


def test_at_most_limit_requests_wait() -> None:
    async def run() -> None:
        bound = await full(2)
        waiters = [asyncio.create_task(bound.enter(5.0)) for _ in range(2)]
        await asyncio.sleep(0.02)
        assert not await bound.enter(5.0)  # the queue is full: rejected at once
        bound.leave()
        bound.leave()
        assert await asyncio.gather(*waiters) == [True, True]

    asyncio.run(run())


def test_a_cancelled_waiter_leaves_the_queue() -> None:
    async def run() -> None:
        bound = await full(2)
        gone = asyncio.create_task(bound.enter(5.0))
        nxt = asyncio.create_task(bound.enter(5.0))
        await asyncio.sleep(0.02)
        gone.cancel()
        await asyncio.sleep(0.02)
        assert len(bound._waiting) == 1  # noqa: SLF001
        bound.leave()
        assert await nxt and bound.count == 2

    asyncio.run(run())


def test_the_admission_wait_is_validated() -> None:
    assert RouterConfig(model="/m", admission_wait_s=0.5).admission_wait_s == 0.5
    for bad in (-1.0, float("inf"), True, "1"):
        with pytest.raises(ValueError, match="admission_wait_s"):
            RouterConfig(model="/m", admission_wait_s=bad)
