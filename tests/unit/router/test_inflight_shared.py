"""One in-flight bound shared by several fronts (router/front_slots.py): each front's count in its own
slot of one mapped file, admission while the sum is below the limit. Two bounds in one process map the
same file as two front processes do."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from router.config import RouterConfig
from router.front_slots import SLOTS_FILE, FrontSlots, create_slots, reset_slot
from router.inflight import InflightBound
from router.router_metrics import RouterMetrics


def _bounds(directory: Path, limit: int, count: int = 2) -> list[InflightBound]:
    create_slots(directory, count)
    bounds = [InflightBound(limit, RouterMetrics(), FrontSlots(str(directory), i)) for i in range(count)]
    for bound in bounds:
        bound.open()
    return bounds


def test_fronts_share_one_bound(tmp_path: Path) -> None:
    a, b = _bounds(tmp_path, limit=3)
    assert a.try_enter() and a.try_enter() and b.try_enter()
    assert not a.try_enter() and not b.try_enter()  # 3 in flight across both fronts
    assert (a.count, b.count, a.total, b.total) == (2, 1, 3, 3)
    b.leave()
    assert b.try_enter()  # the place b freed may go to either front
    a.leave()
    assert b.try_enter() and (a.count, b.count, a.total) == (1, 2, 3)
    assert not a.try_enter()
    assert a._metrics.requests.value(status="rejected") == 2


def test_a_waiting_request_takes_a_place_freed_on_another_front(tmp_path: Path) -> None:
    a, b = _bounds(tmp_path, limit=1)
    assert b.try_enter()

    async def run() -> bool:
        waiter = asyncio.create_task(a.enter(5.0))
        await asyncio.sleep(0.05)
        assert not waiter.done()  # b holds the only place
        b.leave()  # nothing wakes a: it sees the freed slot on its next poll
        return await asyncio.wait_for(waiter, 1.0)

    assert asyncio.run(run()) and (a.count, b.count) == (1, 0)


def test_a_restarted_front_starts_from_zero(tmp_path: Path) -> None:
    a, b = _bounds(tmp_path, limit=2)
    assert b.try_enter() and b.try_enter()
    assert not a.try_enter()
    again = InflightBound(2, RouterMetrics(), FrontSlots(str(tmp_path), 1))
    again.open()  # front 1 restarted: its old requests died with it
    assert a.try_enter() and a.total == 1
    b.close()  # the dead process's mapping (it never writes again)
    assert again.try_enter() and not a.try_enter()
    reset_slot(tmp_path, 1)  # the launcher's reset when it sees front 1 dead
    assert a.try_enter()


def test_without_shared_slots_a_front_counts_alone(tmp_path: Path) -> None:
    alone = InflightBound(1, RouterMetrics())
    alone.open()
    assert alone.try_enter() and not alone.try_enter() and alone.total == 1
    alone.leave()
    alone.close()
    assert alone.try_enter()


def test_closed_bound_counts_alone_and_frees_its_slot(tmp_path: Path) -> None:
    a, b = _bounds(tmp_path, limit=2)
    assert a.try_enter() and a.try_enter()
    a.close()
    assert b.total == 0 and b.try_enter()
    a.leave()  # a request that ends after close: counted locally only
    assert a.count == 1 and b.total == 1


def test_bad_slots_are_refused(tmp_path: Path) -> None:
    create_slots(tmp_path, 2)
    with pytest.raises(ValueError, match="front 2 has no slot"):
        FrontSlots(str(tmp_path), 2).open()
    (tmp_path / SLOTS_FILE).write_bytes(b"\0" * 12)
    with pytest.raises(ValueError, match="int64 slots"):
        FrontSlots(str(tmp_path), 0).open()
    with pytest.raises(ValueError, match="index"):
        FrontSlots(str(tmp_path), -1)
    with pytest.raises(ValueError, match="directory"):
        FrontSlots("", 0)
    with pytest.raises(ValueError, match="count"):
        create_slots(tmp_path, 0)


def test_fronts_dir_needs_a_front_index() -> None:
    with pytest.raises(ValueError, match="fronts_dir needs front"):
        RouterConfig(model="/m", fronts_dir="/tmp/fronts")
    with pytest.raises(ValueError, match="fronts_dir"):
        RouterConfig(model="/m", front=0, fronts_dir="")
    assert RouterConfig(model="/m", front=1, fronts_dir="/tmp/fronts").fronts_dir == "/tmp/fronts"
