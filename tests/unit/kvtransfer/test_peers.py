"""kvtransfer.peers: which transports a worker starts, which one a sender picks per receiver, and a
sender set and a receiver set moving blocks over real tcp sockets within one process."""

from __future__ import annotations

import time

import pytest
import torch
from kv_procs import CacheSpec

from common.wire.handoff import HandOff, IpcExport
from kvtransfer import KVTransferConfig, TransferStatus
from kvtransfer.peers import KVReceiverSet, KVSenderSet, transport_for_peer, transports_for
from tests.helpers.polling import poll_until

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    "requested, device, expected",
    [
        ("auto", "cuda", ["ipc", "nccl"]),
        ("auto", "cpu", ["tcp"]),
        ("nccl", "cuda", ["nccl"]),
        ("tcp", "cuda", ["tcp"]),
    ],
)
def test_transports_for(requested, device, expected) -> None:
    assert transports_for(requested, device) == expected


@pytest.mark.parametrize(
    "peer, expected",
    [("tcp://10.0.0.1:5000", "ipc"), ("tcp://10.0.0.2:5000", "nccl"), ("not-an-address", "nccl")],
)
def test_transport_for_peer_compares_hosts(peer, expected) -> None:
    assert transport_for_peer("auto", "cuda", "10.0.0.1", peer) == expected
    assert transport_for_peer("auto", "cpu", "10.0.0.1", peer) == "tcp"
    assert transport_for_peer("nccl", "cuda", "10.0.0.1", peer) == "nccl"


def test_bad_requested_transport_is_refused() -> None:
    with pytest.raises(ValueError, match="transport"):
        transports_for("udp", "cpu")


@pytest.fixture
def peers():
    src, dst = CacheSpec(num_blocks=16).make(), CacheSpec(num_blocks=16, seed=7).make()
    senders = KVSenderSet(src, KVTransferConfig(transport="auto", host="127.0.0.1", lease_s=5.0))
    receivers = KVReceiverSet(dst, KVTransferConfig(transport="auto", fetch_timeout_s=5.0))
    assert senders.transports == receivers.transports == ["tcp"]
    senders.start()
    receivers.start()
    yield senders, receivers, src, dst
    senders.close()
    receivers.close()
    senders.close()  # idempotent


def test_blocks_move_and_the_publication_is_released(peers) -> None:
    senders, receivers, src, dst = peers
    dtype = str(src.dtype).removeprefix("torch.")
    assert senders.summary() == receivers.summary() == {"transports": ["tcp"], "kv_dtype": dtype}
    handoff = senders.publish("r1", "tcp://127.0.0.1:9", [3, 5])
    assert (handoff.transport, handoff.request_id, handoff.num_blocks) == ("tcp", "r1", 2)
    assert receivers.fetch(handoff, [10, 0]) is None
    (result,) = poll_until(receivers.poll)
    assert result.status is TransferStatus.DONE and result.num_bytes > 0
    assert torch.equal(dst[:, :, [10, 0]], src[:, :, [3, 5]])
    (release,) = poll_until(senders.poll_released)
    assert (release.request_id, release.status) == ("r1", TransferStatus.DONE)
    assert not senders.cancel("r1")  # released: nothing left to cancel


def test_a_transport_not_started_is_an_error_not_a_hang(peers) -> None:
    _, receivers, _, _ = peers
    ipc = IpcExport(1, 1.0, {}, [1], [None], None)
    error = receivers.fetch(HandOff("ipc", "tcp://127.0.0.1:9", "r1", 1, 1, 1, ipc=ipc), [1])
    assert "not accepted here" in error and "tcp" in error
    assert receivers.poll() == []


def test_cancel_drops_the_publication_without_a_release(peers) -> None:
    senders, _, _, _ = peers
    senders.publish("r1", "tcp://127.0.0.1:9", [1])
    assert senders.cancel("r1")
    time.sleep(0.1)
    assert senders.poll_released() == []
    with pytest.raises(ValueError, match="src_block_ids"):
        senders.publish("r2", "tcp://127.0.0.1:9", [99])  # the caller's bug still raises
