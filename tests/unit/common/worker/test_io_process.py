"""`--worker-io process`: the worker's channels in a real child process, against a real ZMQ router inbox.

What thread mode guarantees must hold across the process boundary: registration and heartbeats carry
the posted load, commands arrive decoded (garbage dropped, a malformed request failed back), a loop
turn's messages arrive in order, and the child ends with the pair; a dead child is an error here, not
silence."""

from __future__ import annotations

import os
import queue
import signal

import msgpack
import pytest
import zmq

from common.config import EngineConfig
from common.wire.messages import (
    Abort,
    PrefillRequest,
    RequestFailed,
    TokenBatch,
    TokenOutput,
    WorkerHeartbeat,
    WorkerRegister,
    decode,
    encode,
)
from common.wire.sampling_params import SamplingParams
from common.worker.config import WorkerConfig, resolve_worker_io
from common.worker.io_process import ChannelProcessDied, ChannelSpec, ProcessChannels
from common.worker.role import LoadReport
from tests.helpers.fake_router import receive, registration


def spec(router_addr: str, host: str = "127.0.0.1") -> ChannelSpec:
    return ChannelSpec("p0", router_addr, host, True, 0.05, 2.0, "WARNING")


@pytest.fixture
def started(router_inbox):
    inbox, addr = router_inbox
    channels = ProcessChannels(spec(addr))
    bound = channels.start()
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(bound.command_addr)
    yield channels, bound, inbox, push
    push.close(linger=0)
    channels.close()


def test_registration_and_heartbeats_carry_the_posted_load(started) -> None:
    channels, bound, inbox, _ = started
    assert bound.command_addr.startswith("tcp://127.0.0.1:") and bound.events_addr
    channels.load = LoadReport(num_free_blocks=7, num_total_blocks=8)
    channels.register(registration(bound.command_addr, bound.events_addr))
    assert receive(inbox, WorkerRegister).command_addr == bound.command_addr
    beat = receive(inbox, WorkerHeartbeat)
    assert (beat.num_free_blocks, beat.num_total_blocks) == (7, 8)


def test_commands_arrive_decoded_and_garbage_is_dropped(started) -> None:
    channels, _, inbox, push = started
    with pytest.raises(queue.Empty):
        channels.inbox.get_nowait()
    for garbage in (b"\xff\x00", msgpack.packb({"type": "abort"})):
        push.send(garbage)
    push.send(encode(Abort("r1")))
    push.send(encode(Abort("r2")))
    assert channels.inbox.get(timeout=5) == Abort("r1")
    assert channels.inbox.get(timeout=5) == Abort("r2")


def test_a_malformed_request_is_failed_back_by_the_child(started) -> None:
    _, _, inbox, push = started
    good = encode(PrefillRequest("r1", [1, 2], SamplingParams(), "d", "tcp://127.0.0.1:9", None))
    bad = msgpack.unpackb(good)
    bad["sampling"]["max_tokens"] = 0
    push.send(msgpack.packb(bad))
    failed = receive(inbox, RequestFailed)
    assert (failed.request_id, failed.retryable) == ("r1", False) and "max_tokens" in failed.error


def test_a_held_turn_arrives_in_order_and_other_sends_go_at_once(started) -> None:
    channels, _, inbox, _ = started
    channels.hold_wakes()
    channels.to_front(None, TokenOutput("a", "p0", 0, [1], None, 1, 0))
    channels.to_front(None, TokenBatch("p0", ["a", "b"], [1, 0], [[2], [3]], [1, 1]))
    channels.to_front(None, TokenOutput("a", "p0", 2, [4], "stop", 1, 0))
    assert not inbox.poll(200)  # held: nothing leaves before the turn ends
    channels.release_wakes()
    got = [decode(inbox.recv()) for _ in range(3)]
    assert [type(m).__name__ for m in got] == ["TokenOutput", "TokenBatch", "TokenOutput"]
    assert got[1].token_ids == [[2], [3]] and got[2].finish_reason == "stop"
    channels.to_front(None, TokenOutput("c", "p0", 0, [9], "length", 1, 0))  # not holding: sent now
    assert receive(inbox, TokenOutput).request_id == "c"


def test_the_child_ends_with_the_pair(router_inbox) -> None:
    _, addr = router_inbox
    channels = ProcessChannels(spec(addr))
    channels.start()
    child = channels._proc
    channels.close()
    assert child.poll() == 0
    channels.close()  # idempotent


def test_a_dead_child_is_an_error_not_silence(started) -> None:
    channels, *_ = started
    os.kill(channels._proc.pid, signal.SIGKILL)
    channels._proc.wait(timeout=5)
    with pytest.raises(ChannelProcessDied):
        channels.inbox.get(timeout=5)
    with pytest.raises(ChannelProcessDied):
        channels.to_front(None, Abort("x"))


def test_sockets_that_cannot_be_set_up_fail_the_start(router_inbox) -> None:
    _, addr = router_inbox
    channels = ProcessChannels(spec(addr, host="203.0.113.1"))  # not an address of this machine
    with pytest.raises(ValueError, match="cannot set up the worker's sockets"):
        channels.start()
    channels.close()


def test_auto_worker_io_takes_a_process_only_with_cores_to_spare() -> None:
    assert resolve_worker_io("auto", 16) == "process" and resolve_worker_io("auto", 2) == "thread"
    assert resolve_worker_io("thread", 16) == "thread" and resolve_worker_io("process", 1) == "process"
    with pytest.raises(ValueError, match="worker_io"):
        resolve_worker_io("fiber", 4)


def test_worker_io_is_validated() -> None:
    engine = EngineConfig("/m")
    assert WorkerConfig("w", "tcp://127.0.0.1:1", engine, worker_io="process").worker_io == "process"
    with pytest.raises(ValueError, match="worker_io"):
        WorkerConfig("w", "tcp://127.0.0.1:1", engine, worker_io="fiber")
