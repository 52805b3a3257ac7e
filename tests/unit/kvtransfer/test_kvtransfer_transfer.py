"""End-to-end transfers between a sender in a spawned process and a receiver in this one, over real
sockets on 127.0.0.1, for every transport that runs on CPU (nccl runs its protocol over gloo here)."""

from __future__ import annotations

import time
from dataclasses import replace

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


@pytest.mark.parametrize("named", ["another request id", "another nonce"])
def test_a_fetch_of_no_live_publication_is_refused(sender, receivers, named):
    """The fetch names the publication (request id and nonce): the sender serves nothing else, and a
    refusal does not end the publication it does hold."""
    transport, proc = sender
    rid = f"{transport}-{named}"
    handoff = proc.publish(rid, [1, 2])
    wrong = replace(handoff, request_id=f"{rid}-never-published")
    if named == "another nonce":
        wrong = replace(handoff, nonce=handoff.nonce ^ 1)
    receiver = receivers(transport, SPECS[0].with_(num_blocks=8).make())
    receiver.fetch(wrong, [3, 4], timeout_s=10)
    result = wait_results(receiver, [wrong.request_id])[wrong.request_id]
    assert result.status is FAILED and "unknown publication" in result.error
    assert proc.cancel(rid) is True  # still published


def test_lease_expiry_releases_failed(sender, receivers):
    transport, proc = sender
    rid = f"{transport}-lease"
    handoff = proc.publish(rid, [1, 2, 3], 0.3)
    released = proc.wait_released([rid], timeout=5)
    assert released[rid][0] == "failed" and "lease" in released[rid][1]
    receiver = receivers(transport, SPECS[0].with_(num_blocks=8).make())
    receiver.fetch(handoff, [0, 1, 2], timeout_s=10)
    assert wait_results(receiver, [rid])[rid].status is FAILED


def test_cancel_drops_publication_without_release(sender, receivers):
    transport, proc = sender
    rid = f"{transport}-cancel"
    handoff = proc.publish(rid, [4, 5])
    assert proc.cancel(rid) is True
    assert proc.cancel(rid) is False
    receiver = receivers(transport, SPECS[0].with_(num_blocks=8).make())
    receiver.fetch(handoff, [0, 1], timeout_s=10)
    assert "unknown publication" in wait_results(receiver, [rid])[rid].error
    assert rid not in proc.released()


@pytest.mark.parametrize(
    "mismatch, message",
    [({"dtype": "float32"}, "dtype mismatch"), ({"head_dim": 16}, "block shape mismatch")],
    ids=["dtype", "shape"],
)
def test_layout_mismatch_fails_both_sides(sender, receivers, mismatch, message):
    transport, proc = sender
    rid = f"{transport}-mismatch-{message}"
    handoff = proc.publish(rid, [6, 7])
    receiver = receivers(transport, SPECS[0].with_(num_blocks=8, **mismatch).make())
    receiver.fetch(handoff, [0, 1], timeout_s=10)
    result = wait_results(receiver, [rid])[rid]
    assert result.status is FAILED and message in result.error
    released = proc.wait_released([rid])
    assert released[rid][0] == "failed" and message in released[rid][1]


def test_nonexistent_sender_fails_within_timeout(sender, receivers):
    transport, proc = sender
    receiver = receivers(transport, SPECS[0].with_(num_blocks=8).make())
    handoff = replace(proc.publish("nobody-home", [1]), address=closed_port_address())
    t0 = time.monotonic()
    receiver.fetch(handoff, [1], timeout_s=0.5)
    result = wait_results(receiver, ["nobody-home"], timeout=5)["nobody-home"]
    assert result.status is FAILED and "timed out" in result.error
    assert time.monotonic() - t0 < 2.0


@pytest.mark.parametrize("transport", ["tcp", "nccl"])
def test_killed_sender_fails_within_timeout(receivers, transport):
    spec = SPECS[0]
    proc = SenderProc(transport, [spec])
    try:
        receiver = receivers(transport, spec.with_(num_blocks=8).make())
        handoff = proc.publish("before-kill", [1, 2])
        receiver.fetch(handoff, [0, 1], timeout_s=20)
        assert wait_results(receiver, ["before-kill"])["before-kill"].status is DONE
        handoff = proc.publish("after-kill", [3, 4])
        proc.kill()
        t0 = time.monotonic()
        receiver.fetch(handoff, [2, 3], timeout_s=1.0)
        result = wait_results(receiver, ["after-kill"], timeout=10)["after-kill"]
        assert result.status is FAILED and result.error
        assert time.monotonic() - t0 < 3.0
    finally:
        proc.stop()


def test_close_fails_in_flight_fetches_promptly(sender, receivers):
    transport, proc = sender
    receiver = create_receiver(transport, SPECS[0].with_(num_blocks=8).make())
    receiver.start()
    handoff = replace(proc.publish(f"{transport}-in-flight", [1]), address=closed_port_address())
    receiver.fetch(handoff, [1], timeout_s=60)
    time.sleep(0.1)
    t0 = time.monotonic()
    receiver.close()
    assert time.monotonic() - t0 < 2.0
    result = receiver.poll()[0]
    assert result.status is FAILED and "closed" in result.error


def _fetch(**fields) -> bytes:
    msg = {"type": "kv_fetch", "request_id": "g", "xid": 1, "nonce": "the publication's", "timeout_s": 1.0}
    msg["layout"] = {"dtype": "bfloat16", "shape": [3, 8, 2, 32]}  # SPECS[0]'s block layout
    return msgpack.packb({**msg, **fields})


GARBAGE = [
    [b""],
    [b"\xff\x00 not msgpack"],
    [msgpack.packb([1, 2, 3])],
    [msgpack.packb({1: 2})],
    [msgpack.packb({"type": "kv_fetch"})],
    [msgpack.packb({"type": "bogus", "request_id": "g", "xid": 1})],
    [msgpack.packb({"type": "abort", "request_id": "g"})],  # a message of the codec, not of this socket
    [msgpack.packb({"type": "kv_ack", "request_id": "g", "xid": 999})],  # stale ack: must not release
    [msgpack.packb({"type": "kv_error", "request_id": "g", "xid": 999, "error": "x"})],
    [_fetch(nonce=-1)],
    [_fetch(xid=0)],
    [_fetch(timeout_s=float("nan"))],
    [_fetch(timeout_s=-1)],
    [_fetch(layout={"dtype": "x", "shape": [1]})],
    [_fetch(layout={"dtype": "x", "shape": [3, 8, 2, 32]})],  # well-formed, unknown dtype: refused
    [_fetch(layout={"dtype": "bfloat16", "shape": [3, 8, 2, True]})],
    [_fetch(request_id="nope", nonce=1)],  # no such publication: refused
    [_fetch(nonce=12345)],  # another nonce: refused
    [_fetch(pair=["not", "an", "id"])],
    [_fetch(), b"x" * 9],  # a fetch with stray frames is still served: its data goes nowhere useful
    [bytes(range(256)) * 8192],  # 2 MiB of noise
]


def test_sender_survives_garbage_frames(sender, receivers):
    transport, proc = sender
    rid = f"{transport}-garbage"
    handoff = proc.publish(rid, [8, 9])
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(handoff.address)
    replies = []
    try:
        for frames in GARBAGE:
            sock.send_multipart([_rename(f, rid, handoff.nonce) for f in frames])
        while sock.poll(500):
            replies.append(msgpack.unpackb(sock.recv_multipart()[0]))
    finally:
        sock.close()
    # Each well-formed fetch the sender will not serve gets an error; over tcp the two good ones are served.
    kinds = [r["type"] for r in replies]
    assert kinds.count("kv_error") >= 3
    assert set(kinds) <= {"kv_error", "kv_data", "kv_sums"}  # nccl: even the good ones lack a pair
    assert rid not in proc.released()  # and garbage released nothing
    receiver = receivers(transport, SPECS[0].with_(num_blocks=8).make())
    receiver.fetch(handoff, [6, 7], timeout_s=20)
    assert wait_results(receiver, [rid])[rid].status is DONE
    assert proc.wait_released([rid])[rid][0] == "done"


def _rename(frame: bytes, rid: str, nonce: int) -> bytes:
    """Point a garbage message at this test's publication where it names "g" (and its nonce)."""
    try:
        msg = msgpack.unpackb(frame, strict_map_key=False)
    except Exception:
        return frame
    if isinstance(msg, dict) and msg.get("request_id") == "g":
        msg = {**msg, "request_id": rid}
        if msg.get("nonce") == "the publication's":
            msg["nonce"] = nonce
        return msgpack.packb(msg)
    return frame
