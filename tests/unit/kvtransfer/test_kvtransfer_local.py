"""Sender and receiver API behaviour within one process (threads, real sockets): argument handling,
statuses, and a receiver fed garbage by a fake sender."""

from __future__ import annotations

from dataclasses import replace

import msgpack
import pytest
import torch
import zmq
from kv_procs import CacheSpec, bits, wait_results

from common.wire.handoff import HandOff, NcclStore
from kvtransfer import KVTransferConfig, TransferStatus, create_receiver, create_sender

pytestmark = pytest.mark.timeout(60)
SPEC = CacheSpec(num_blocks=16)


@pytest.fixture
def sender():
    s = create_sender("tcp", SPEC.make())
    s.start()
    yield s
    s.close()


@pytest.mark.parametrize(
    "ids, lease, message",
    [([], None, "non-empty"), ([16], None, "src_block_ids"), ([1, 1], None, "repeat"), ([1], 0, "lease_s")],
)
def test_publish_rejects_caller_bugs(sender, ids, lease, message):
    with pytest.raises(ValueError, match=message):
        sender.publish("r", ids, lease)


def test_publish_twice_and_non_string_id(sender):
    sender.publish("r", [1])
    with pytest.raises(ValueError, match="already published"):
        sender.publish("r", [2])
    with pytest.raises(ValueError, match="request_id"):
        sender.publish(7, [2])


def test_the_handoff_names_the_publication_at_the_bound_ephemeral_port(sender):
    handoff = sender.publish("r", [4, 2, 9])
    assert (handoff.transport, handoff.request_id, handoff.num_blocks) == ("tcp", "r", 3)
    host, port = handoff.address.removeprefix("tcp://").rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    assert handoff.ipc is None and handoff.nccl is None  # tcp receivers need nothing more
    assert sender.publish("r2", [1]).nonce != handoff.nonce  # one nonce per publication


NCCL = NcclStore("127.0.0.1", 1, "gloo")


@pytest.mark.parametrize(
    "change, dst, timeout, message",
    [
        ({"transport": "nccl", "nccl": NCCL}, [1], 5, "transport"),
        ({}, [1, 2], 5, "must match the 1 blocks published"),
        ({}, [99], 5, "dst_block_ids"),
        ({"num_blocks": 2}, [3, 3], 5, "repeat"),
        ({}, ["a"], 5, "dst_block_ids"),
        ({}, [1], -1, "timeout_s"),
    ],
)
def test_fetch_reports_bad_arguments_as_failed(sender, change, dst, timeout, message):
    receiver = create_receiver("tcp", SPEC.make())
    receiver.start()
    try:
        receiver.fetch(replace(sender.publish("r", [1]), **change), dst, timeout)
        result = receiver.poll()[0]  # reported at once, no network involved
        assert result.status is TransferStatus.FAILED and message in result.error
    finally:
        receiver.close()


def test_statuses_and_duplicate_fetch(sender):
    cache = SPEC.with_(seed=5).make()
    receiver = create_receiver("tcp", cache)
    receiver.start()
    try:
        assert receiver.status("r") is None
        handoff = sender.publish("r", [4, 2])
        receiver.fetch(handoff, [0, 15])
        assert receiver.status("r") in (TransferStatus.PENDING, TransferStatus.TRANSFERRING)
        with pytest.raises(ValueError, match="in flight"):
            receiver.fetch(handoff, [0, 15])
        assert wait_results(receiver, ["r"])["r"].status is TransferStatus.DONE
        assert receiver.status("r") is TransferStatus.DONE
        assert torch.equal(bits(cache[:, :, [0, 15]]), bits(SPEC.make()[:, :, [4, 2]]))
        assert [(r.request_id, r.status) for r in _wait_released(sender)] == [("r", TransferStatus.DONE)]
    finally:
        receiver.close()


def test_receiver_survives_garbage_replies(sender):
    """A fake sender answers a fetch with garbage: the receiver ignores what names no live attempt, fails
    the request on a malformed reply (telling the sender), leaves the dst blocks alone, and keeps serving."""
    fake = zmq.Context.instance().socket(zmq.ROUTER)
    fake.setsockopt(zmq.LINGER, 0)
    port = fake.bind_to_random_port("tcp://127.0.0.1")
    cache = SPEC.make()
    before = cache.clone()
    receiver = create_receiver("tcp", cache, KVTransferConfig(poll_interval_s=0.01))
    receiver.start()
    try:
        receiver.fetch(HandOff("tcp", f"tcp://127.0.0.1:{port}", "r", 1, 1, 2), [2, 3], 10)
        assert fake.poll(5000)
        ident, header = fake.recv_multipart()
        xid = msgpack.unpackb(header)["xid"]
        data = {"type": "kv_data", "request_id": "r", "xid": xid, "first": 0, "count": 1, "sums": True}
        garbage = [
            [b"junk"],
            [msgpack.packb(["list"])],
            [msgpack.packb({**data, "request_id": "other"}), b"x"],  # another request
            [msgpack.packb({**data, "xid": xid + 1}), b"x"],  # another attempt
            [msgpack.packb({"type": "abort", "request_id": "r"})],  # the codec's, but not for this socket
        ]
        for frames in garbage:
            fake.send_multipart([ident, *frames])
        assert not wait_results(receiver, ["r"], timeout=0.3)  # all of that was ignored
        fake.send_multipart([ident, msgpack.packb({**data, "count": 2}), b"too short"])
        result = wait_results(receiver, ["r"])["r"]
        assert result.status is TransferStatus.FAILED and "malformed reply" in result.error
        assert fake.poll(5000) and msgpack.unpackb(fake.recv_multipart()[1])["type"] == "kv_error"
        assert torch.equal(bits(cache), bits(before))

        receiver.fetch(sender.publish("ok", [5]), [6])
        assert wait_results(receiver, ["ok"])["ok"].status is TransferStatus.DONE
    finally:
        receiver.close()
        fake.close()


def _wait_released(sender, timeout: float = 5.0):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        released = sender.poll_released()
        if released:
            return released
        time.sleep(0.01)
    return []


def test_block_copy_on_the_cpu_moves_exactly_the_named_blocks():
    from kvtransfer.block_copy import copy_blocks

    src = torch.randn(2, 2, 9, 4, 1, 8)
    dst = torch.zeros(2, 2, 5, 4, 1, 8)
    copy_blocks(src, dst, torch.tensor([8, 0, 4]), torch.tensor([1, 4, 0]))
    assert torch.equal(dst[:, :, [1, 4, 0]], src[:, :, [8, 0, 4]])
    assert dst[:, :, [2, 3]].abs().sum() == 0
    with pytest.raises(ValueError, match="differ in length"):
        copy_blocks(src, dst, torch.tensor([1, 2]), torch.tensor([0]))
