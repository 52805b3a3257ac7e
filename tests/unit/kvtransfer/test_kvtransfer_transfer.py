"""End-to-end transfers between a sender in a spawned process and a receiver in this one, over real
sockets on 127.0.0.1, for every transport that runs on CPU (nccl runs its protocol over gloo here)."""

from __future__ import annotations

import time

import msgpack
import pytest
import zmq
from kv_procs import (
    DST_BLOCKS,
    SPECS,
    SenderProc,
    check_concurrent_transfers,
    closed_port_address,
    wait_results,
)

from kvtransfer import TransferStatus, create_receiver

pytestmark = pytest.mark.timeout(120)

DONE, FAILED = TransferStatus.DONE, TransferStatus.FAILED


@pytest.fixture(params=["tcp", "nccl"])
def sender(request, sender_pool):
    return request.param, sender_pool(request.param)


@pytest.mark.parametrize("which", [0, 1], ids=["bf16", "fp32"])
def test_concurrent_transfers_are_bitwise_exact(sender, receivers, which):
    transport, proc = sender
    cache = SPECS[which].with_(num_blocks=DST_BLOCKS, seed=7).make()
    check_concurrent_transfers(proc, which, receivers(transport, cache), cache, tag=transport)


def test_unknown_request_fails(sender, receivers):
    transport, proc = sender
    receiver = receivers(transport, SPECS[0].with_(num_blocks=8).make())
    receiver.fetch("never-published", proc.endpoints[0], [1, 2], [3, 4], timeout_s=10)
    result = wait_results(receiver, ["never-published"])["never-published"]
    assert result.status is FAILED
    assert "unknown request_id" in result.error


def test_lease_expiry_releases_failed(sender, receivers):
    transport, proc = sender
    rid = f"{transport}-lease"
    endpoint = proc.publish(rid, [1, 2, 3], 0.3)
    released = proc.wait_released([rid], timeout=5)
    assert released[rid][0] == "failed" and "lease" in released[rid][1]
    receiver = receivers(transport, SPECS[0].with_(num_blocks=8).make())
    receiver.fetch(rid, endpoint, [1, 2, 3], [0, 1, 2], timeout_s=10)
    assert wait_results(receiver, [rid])[rid].status is FAILED


def test_cancel_drops_publication_without_release(sender, receivers):
    transport, proc = sender
    rid = f"{transport}-cancel"
    endpoint = proc.publish(rid, [4, 5])
    assert proc.cancel(rid) is True
    assert proc.cancel(rid) is False
    receiver = receivers(transport, SPECS[0].with_(num_blocks=8).make())
    receiver.fetch(rid, endpoint, [4, 5], [0, 1], timeout_s=10)
    assert "unknown request_id" in wait_results(receiver, [rid])[rid].error
    assert rid not in proc.released()


@pytest.mark.parametrize(
    "mismatch, message",
    [({"dtype": "float32"}, "dtype mismatch"), ({"head_dim": 16}, "block shape mismatch")],
    ids=["dtype", "shape"],
)
def test_layout_mismatch_fails_both_sides(sender, receivers, mismatch, message):
    transport, proc = sender
    rid = f"{transport}-mismatch-{message}"
    endpoint = proc.publish(rid, [6, 7])
    receiver = receivers(transport, SPECS[0].with_(num_blocks=8, **mismatch).make())
    receiver.fetch(rid, endpoint, [6, 7], [0, 1], timeout_s=10)
    result = wait_results(receiver, [rid])[rid]
    assert result.status is FAILED and message in result.error
    released = proc.wait_released([rid])
    assert released[rid][0] == "failed" and message in released[rid][1]


def test_nonexistent_sender_fails_within_timeout(sender, receivers):
    transport, proc = sender
    receiver = receivers(transport, SPECS[0].with_(num_blocks=8).make())
    endpoint = dict(proc.endpoints[0], address=closed_port_address())
    t0 = time.monotonic()
    receiver.fetch("nobody-home", endpoint, [1], [1], timeout_s=0.5)
    result = wait_results(receiver, ["nobody-home"], timeout=5)["nobody-home"]
    assert result.status is FAILED and "timed out" in result.error
    assert time.monotonic() - t0 < 2.0


@pytest.mark.parametrize("transport", ["tcp", "nccl"])
def test_killed_sender_fails_within_timeout(receivers, transport):
    spec = SPECS[0]
    proc = SenderProc(transport, [spec])
    try:
        receiver = receivers(transport, spec.with_(num_blocks=8).make())
        endpoint = proc.publish("before-kill", [1, 2])
        receiver.fetch("before-kill", endpoint, [1, 2], [0, 1], timeout_s=20)
        assert wait_results(receiver, ["before-kill"])["before-kill"].status is DONE
        endpoint = proc.publish("after-kill", [3, 4])
        proc.kill()
        t0 = time.monotonic()
        receiver.fetch("after-kill", endpoint, [3, 4], [2, 3], timeout_s=1.0)
        result = wait_results(receiver, ["after-kill"], timeout=10)["after-kill"]
        assert result.status is FAILED and result.error
        assert time.monotonic() - t0 < 3.0
    finally:
        proc.stop()


def test_close_fails_in_flight_fetches_promptly(sender, receivers):
    transport, proc = sender
    receiver = create_receiver(transport, SPECS[0].with_(num_blocks=8).make())
    receiver.start()
    endpoint = dict(proc.endpoints[0], address=closed_port_address())
    receiver.fetch("in-flight", endpoint, [1], [1], timeout_s=60)
    time.sleep(0.1)
    t0 = time.monotonic()
    receiver.close()
    assert time.monotonic() - t0 < 2.0
    result = receiver.poll()[0]
    assert result.status is FAILED and "closed" in result.error


def _fetch(**fields) -> bytes:
    msg = {"t": "fetch", "rid": "g", "xid": 1, "src": [8], "timeout": 1.0}
    msg["layout"] = {"dtype": "bfloat16", "shape": [3, 8, 2, 32]}  # SPECS[0]'s block layout
    return msgpack.packb({**msg, **fields})


GARBAGE = [
    [b""],
    [b"\xff\x00 not msgpack"],
    [msgpack.packb([1, 2, 3])],
    [msgpack.packb({1: 2})],
    [msgpack.packb({"t": "fetch"})],
    [msgpack.packb({"t": "bogus", "rid": "g", "xid": 1})],
    [msgpack.packb({"t": "ack", "rid": "g", "xid": 999})],  # stale ack: must not release
    [msgpack.packb({"t": "error", "rid": "g", "xid": 999, "error": "x"})],
    [_fetch(src=["x"])],
    [_fetch(src=[1, 1])],
    [_fetch(src=[-1])],
    [_fetch(timeout=float("nan"))],
    [_fetch(timeout=-1)],
    [_fetch(layout={"dtype": "x", "shape": [1]})],
    [_fetch(layout={"dtype": "bfloat16", "shape": [3, 8, 2, True]})],
    [_fetch(rid="nope", src=[2**63 - 1])],
    [_fetch(pair=["not", "an", "id"])],  # only the nccl transport reads it
    [_fetch(), b"x" * 9],  # a fetch with stray frames is still served: its data goes nowhere useful
    [bytes(range(256)) * 8192],  # 2 MiB of noise
]


def test_sender_survives_garbage_frames(sender, receivers):
    transport, proc = sender
    rid = f"{transport}-garbage"
    endpoint = proc.publish(rid, [8, 9])
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(proc.endpoints[0]["address"])
    replies = []
    try:
        for frames in GARBAGE:
            sock.send_multipart([_rename(f, rid) for f in frames])
        while sock.poll(500):
            replies.append(msgpack.unpackb(sock.recv_multipart()[0]))
    finally:
        sock.close()
    # Each bad fetch that names a request gets an error; over tcp the two well-formed ones are served.
    assert sum(r["t"] == "error" for r in replies) >= 8
    assert {r["t"] for r in replies} <= {"error", "data", "sums"}  # nccl: even those two lack a pair
    assert rid not in proc.released()  # and garbage released nothing
    receiver = receivers(transport, SPECS[0].with_(num_blocks=8).make())
    receiver.fetch(rid, endpoint, [8, 9], [6, 7], timeout_s=20)
    assert wait_results(receiver, [rid])[rid].status is DONE
    assert proc.wait_released([rid])[rid][0] == "done"


def _rename(frame: bytes, rid: str) -> bytes:
    """Point a garbage message at this test's request id where it names "g"."""
    try:
        msg = msgpack.unpackb(frame, strict_map_key=False)
    except Exception:
        return frame
    if isinstance(msg, dict) and msg.get("rid") == "g":
        return msgpack.packb({**msg, "rid": rid})
    return frame
