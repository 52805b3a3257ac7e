"""WorkerChannels' held wakes: the engine thread's sends of one loop turn wake the I/O thread once, at the
release; sends from any other thread (or outside a hold) wake it at once."""

from __future__ import annotations

import threading

from common.wire.messages import Abort
from common.worker.channels import WorkerChannels


class CountingWaker:
    def __init__(self) -> None:
        self.wakes = 0

    def wake(self) -> None:
        self.wakes += 1


def channels() -> WorkerChannels:
    ch = WorkerChannels("w0", "tcp://127.0.0.1:1", "127.0.0.1", with_events=False)
    ch._waker = CountingWaker()  # not started: only the queueing side is under test
    return ch


def queued(ch: WorkerChannels) -> list:
    out = []
    while not ch._outbox.empty():
        out.append(ch._outbox.get_nowait())
    return out


def test_sends_wake_at_once_outside_a_hold() -> None:
    ch = channels()
    ch.to_front(None, Abort("a"))
    ch.publish(Abort("b"))
    assert ch._waker.wakes == 2


def test_held_sends_wake_once_at_the_release_in_order() -> None:
    ch = channels()
    ch.hold_wakes()
    for rid in ("a", "b", "c"):
        ch.to_front(None, Abort(rid))
    assert ch._waker.wakes == 0
    ch.release_wakes()
    assert ch._waker.wakes == 1
    assert [m.request_id for _, m in queued(ch)] == ["a", "b", "c"]
    ch.release_wakes()  # nothing queued since: no wake
    ch.hold_wakes()
    ch.release_wakes()
    assert ch._waker.wakes == 1


def test_another_threads_send_is_not_held() -> None:
    ch = channels()
    ch.hold_wakes()
    other = threading.Thread(target=ch.to_front, args=(None, Abort("x")))
    other.start()
    other.join()
    assert ch._waker.wakes == 1
    ch.release_wakes()
    assert ch._waker.wakes == 1  # this thread queued nothing
