"""Verified hand-offs (kvtransfer/verify.py): each corruption injected through the real transports (a
sender in a spawned process, real sockets on 127.0.0.1; nccl runs over gloo here) fails the transfer
with a message saying which check caught it, leaves the destination blocks unwritten, and releases the
sender's publication; the same transfers without the corruption are DONE and bitwise exact."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from kv_procs import SPECS, bits, chain_for, wait_results

from kvtransfer import KVTransferConfig, TransferStatus
from kvtransfer.block_copy import checksum_blocks
from kvtransfer.layout import flat_view
from kvtransfer.verify import (
    VerificationFailed,
    block_checksums,
    check_residuals,
    pack_sums,
    unpack_sums,
)
from tests.helpers.kv_proxy import KVProxy, flip_a_byte, redirect_fetch

pytestmark = pytest.mark.timeout(120)

SRC, DST = [3, 9, 4], [0, 1, 2]


@pytest.fixture(params=["tcp", "nccl"])
def sender(request, sender_pool):
    return request.param, sender_pool(request.param)


def _blank():
    return SPECS[0].with_(num_blocks=8, seed=5).make()


def _fetch(receiver, handoff, chain):
    receiver.fetch(handoff, DST, timeout_s=20, block_hashes=chain)
    return wait_results(receiver, [handoff.request_id])[handoff.request_id]


def test_checksums_see_a_flipped_bit_a_swapped_block_and_a_swapped_plane() -> None:
    blocks = flat_view(SPECS[0].make())[:, :6].contiguous()
    base = block_checksums(blocks)
    flipped = blocks.clone()
    flipped.view(torch.uint8)[5, 2, 7] ^= 1
    assert (block_checksums(flipped) != base).tolist() == [False, False, True, False, False, False]
    swapped = blocks[:, [1, 0, 2, 3, 4, 5]]
    assert block_checksums(swapped)[:2].tolist() == base[[1, 0]].tolist() != base[:2].tolist()
    planes = blocks.clone()
    planes[[0, 1]] = blocks[[1, 0]]
    assert not torch.equal(block_checksums(planes), base)
    odd = torch.arange(2 * 3 * 5, dtype=torch.uint8).view(2, 3, 5)  # bytes per block not a multiple of 8
    assert block_checksums(odd).shape == (3,)
    cache, index = SPECS[0].make(), torch.tensor([7, 3, 40, 41, 0])
    grouped = checksum_blocks(cache, index, group=2)  # the CPU form: bounded temporaries
    assert torch.equal(grouped, block_checksums(flat_view(cache)[:, index].contiguous()))


def test_residuals_name_the_first_block_that_differs() -> None:
    """What a checking copy leaves (received minus sent, wrapping) passes only when all are 0, and the
    error gives both sums back, even across the int64 wrap."""
    sent = torch.tensor([5, -(2**63), 2**63 - 1])
    check_residuals(torch.zeros(3, dtype=torch.int64), sent)
    with pytest.raises(
        VerificationFailed, match=f"block 4: checksum {2**63 - 1} of the bytes received, {-(2**63)}"
    ):
        check_residuals(torch.tensor([0, -1, 0]), sent, first=3)
    with pytest.raises(VerificationFailed, match=f"block 2: checksum {-(2**63)} of the bytes received"):
        check_residuals(torch.tensor([0, 0, 1]), sent)


@pytest.mark.parametrize("raw", [None, [1, 2, 3], b"\0" * 16, b"\0" * 25, "x" * 24])
def test_sums_a_sender_did_not_send_fail_closed(raw) -> None:
    with pytest.raises(VerificationFailed, match="no checksums for its 3 blocks"):
        unpack_sums(raw, 3)


def test_sums_travel_as_they_were_taken() -> None:
    sums = torch.tensor([1, -(2**63), 2**63 - 1, -5])
    assert torch.equal(unpack_sums(pack_sums(sums), 4), sums)
    assert pack_sums(torch.tensor([1]))[:2] == b"\x01\x00"  # little-endian on every host


def test_a_clean_transfer_passes_every_check(sender, receivers) -> None:
    transport, proc = sender
    chain = chain_for(len(SRC), "clean")
    handoff = proc.publish(f"{transport}-clean", SRC, block_hashes=chain)
    cache = _blank()
    result = _fetch(receivers(transport, cache), handoff, chain)
    assert result.status is TransferStatus.DONE, result.error
    assert torch.equal(bits(cache[:, :, DST]), bits(SPECS[0].make()[:, :, SRC]))


def _assert_failed_closed(result, cache, before, proc, rid, message) -> None:
    assert result.status is TransferStatus.FAILED and "verification failed" in result.error
    assert message in result.error, result.error
    assert torch.equal(bits(cache), bits(before))  # nothing it delivered was written
    released = proc.wait_released([rid])
    assert released[rid][0] == "failed"  # the receiver told the sender at once


@pytest.mark.parametrize("corruption", ["wrong blocks", "stale epoch"])
def test_a_transfer_bound_elsewhere_fails_closed(sender, receivers, corruption) -> None:
    transport, proc = sender
    rid = f"{transport}-{corruption}"
    chain = chain_for(len(SRC), rid)
    if corruption == "wrong blocks":  # the sender published blocks of another prompt under this request
        handoff, message = proc.publish(rid, SRC, block_hashes=chain_for(len(SRC), "other")), "wrong blocks"
    else:  # the hand-off came from an earlier run of the sender
        handoff = proc.publish(rid, SRC, block_hashes=chain)
        handoff, message = replace(handoff, epoch=handoff.epoch ^ 1), "another sender epoch"
    cache = _blank()
    before = cache.clone()
    result = _fetch(receivers(transport, cache), handoff, chain)
    _assert_failed_closed(result, cache, before, proc, rid, message)


def test_flipped_bytes_on_the_wire_fail_closed(sender_pool, receivers) -> None:
    proc = sender_pool("tcp")
    chain = chain_for(len(SRC), "flip")
    handoff = proc.publish("tcp-flip", SRC, block_hashes=chain)
    proxy = KVProxy(handoff.address, to_receiver=flip_a_byte)
    try:
        cache = _blank()
        before = cache.clone()
        result = _fetch(receivers("tcp", cache), replace(handoff, address=proxy.address), chain)
        _assert_failed_closed(result, cache, before, proc, "tcp-flip", "checksum")
    finally:
        proxy.close()


def test_without_verification_the_flip_goes_unseen(sender_pool, receivers) -> None:
    """The control for the test above: the flip really reaches the receiver, and only the checks stop
    it (a sender and receiver that do not verify deliver the corrupted block as DONE)."""
    proc = sender_pool("tcp")
    handoff = proc.publish("tcp-flip-unverified", SRC)
    proxy = KVProxy(handoff.address, to_receiver=flip_a_byte)
    try:
        cache = _blank()
        receiver = receivers("tcp", cache, verify=False)
        result = _fetch(receiver, replace(handoff, address=proxy.address), None)
        assert result.status is TransferStatus.DONE
        assert not torch.equal(bits(cache[:, :, DST]), bits(SPECS[0].make()[:, :, SRC]))
    finally:
        proxy.close()


def test_a_transfer_meant_for_another_request_fails_closed(sender, receivers) -> None:
    """The fetch is answered with another request's publication (same block ids, its own prompt)."""
    transport, proc = sender
    rid, other = f"{transport}-mine", f"{transport}-theirs"
    chain = chain_for(len(SRC), rid)
    handoff = proc.publish(rid, SRC, block_hashes=chain)
    theirs = proc.publish(other, SRC, block_hashes=chain_for(len(SRC), other))
    out, back = redirect_fetch(to=theirs, from_request=rid)
    proxy = KVProxy(handoff.address, to_sender=out, to_receiver=back)
    try:
        cache = _blank()
        before = cache.clone()
        result = _fetch(receivers(transport, cache), replace(handoff, address=proxy.address), chain)
        assert result.status is TransferStatus.FAILED and "another request" in result.error
        assert torch.equal(bits(cache), bits(before))
    finally:
        proxy.close()


def test_a_verifying_receiver_refuses_a_sender_that_sends_no_checksums(receivers) -> None:
    from kv_procs import SenderProc

    proc = SenderProc("tcp", [SPECS[0]], verify=False)
    try:
        handoff = proc.publish("no-sums", SRC)
        result = _fetch(receivers("tcp", _blank()), handoff, None)
        assert result.status is TransferStatus.FAILED and "no checksums" in result.error
    finally:
        proc.stop()


def test_verify_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match="verify"):
        KVTransferConfig(verify="yes")
