"""kvtransfer.faults: the PDSERVE_KV_FAULTS switch (parsed once, validated, off by default) and a
fault-injecting receiver set moving blocks over real tcp sockets: a dropped fetch fails after the
delay and the sender's blocks come back through the lease; a delayed one arrives intact, late."""

from __future__ import annotations

import time

import pytest
import torch
from kv_procs import CacheSpec

from kvtransfer import KVTransferConfig, TransferStatus
from kvtransfer.faults import KV_FAULTS_ENV, FaultyReceiverSet, KVFaults, receiver_set
from kvtransfer.peers import KVReceiverSet, KVSenderSet
from tests.helpers.polling import poll_until

pytestmark = pytest.mark.timeout(60)
DELAY_S = 0.6


def test_parse_round_trips_and_validates() -> None:
    faults = KVFaults.parse("drop=0.25, delay=0.5,delay_s=1.5,seed=3")
    assert faults == KVFaults(drop=0.25, delay=0.5, delay_s=1.5, seed=3)
    assert KVFaults.parse(faults.to_env()) == faults
    for text, field in [
        ("drop=2", "drop"),
        ("drop=0.6,delay=0.6", "drop \\+ delay"),
        ("delay_s=0", "delay_s"),
        ("seed=1.5", "seed"),
        ("loss=0.1", "expected one of"),
        ("drop", "expected one of"),
        ("drop=abc", "drop must be a number"),
    ]:
        with pytest.raises(ValueError, match=field):
            KVFaults.parse(text)


def test_off_unless_the_variable_is_set() -> None:
    cache = CacheSpec(num_blocks=4).make()
    config = KVTransferConfig(transport="tcp")
    assert type(receiver_set(cache, config, environ={})) is KVReceiverSet
    assert type(receiver_set(cache, config, environ={KV_FAULTS_ENV: "  "})) is KVReceiverSet
    faulty = receiver_set(cache, config, environ={KV_FAULTS_ENV: "drop=1"})
    assert isinstance(faulty, FaultyReceiverSet) and faulty.faults.drop == 1.0
    with pytest.raises(ValueError, match=KV_FAULTS_ENV):
        receiver_set(cache, config, environ={KV_FAULTS_ENV: "nonsense"})


def test_the_choice_is_per_request_and_reproducible() -> None:
    faults = KVFaults(drop=0.2, delay=0.3, seed=5)
    ids = [f"req-{i}" for i in range(2000)]
    picks = [faults.choose(r) for r in ids]
    assert picks == [faults.choose(r) for r in ids]  # same seed and id, same fault
    assert abs(picks.count("drop") / len(ids) - 0.2) < 0.04
    assert abs(picks.count("delay") / len(ids) - 0.3) < 0.04
    assert picks != [KVFaults(drop=0.2, delay=0.3, seed=6).choose(r) for r in ids]
    assert {KVFaults().choose(r) for r in ids} == {None}


def pair(faults: KVFaults, lease_s: float = 5.0):
    src, dst = CacheSpec(num_blocks=16).make(), CacheSpec(num_blocks=16, seed=7).make()
    senders = KVSenderSet(src, KVTransferConfig(transport="tcp", host="127.0.0.1", lease_s=lease_s))
    receivers = FaultyReceiverSet(dst, KVTransferConfig(transport="tcp", fetch_timeout_s=5.0), faults)
    senders.start()
    receivers.start()
    return senders, receivers, src, dst


def test_a_dropped_fetch_fails_late_and_the_lease_frees_the_sender() -> None:
    senders, receivers, src, dst = pair(KVFaults(drop=1.0, delay_s=DELAY_S), lease_s=1.0)
    try:
        before = dst.clone()
        handoff = senders.publish("r1", "tcp://127.0.0.1:9", [3, 5])
        started = time.monotonic()
        assert receivers.fetch(handoff, [10, 0]) is None
        (result,) = poll_until(receivers.poll)
        assert time.monotonic() - started >= DELAY_S
        assert result.status is TransferStatus.FAILED and "dropped" in result.error
        assert torch.equal(dst, before)  # nothing was written
        (release,) = poll_until(senders.poll_released)  # the receiver never asked: the lease ends it
        assert (release.request_id, release.status) == ("r1", TransferStatus.FAILED)
        assert receivers.poll() == []  # reported once
    finally:
        senders.close()
        receivers.close()


def test_a_delayed_fetch_arrives_intact_after_the_delay() -> None:
    senders, receivers, src, dst = pair(KVFaults(delay=1.0, delay_s=DELAY_S))
    try:
        handoff = senders.publish("r1", "tcp://127.0.0.1:9", [3, 5])
        started = time.monotonic()
        assert receivers.fetch(handoff, [10, 0]) is None
        (result,) = poll_until(receivers.poll)
        assert time.monotonic() - started >= DELAY_S
        assert result.status is TransferStatus.DONE
        assert torch.equal(dst[:, :, [10, 0]], src[:, :, [3, 5]])
        (release,) = poll_until(senders.poll_released)
        assert release.status is TransferStatus.DONE
    finally:
        senders.close()
        receivers.close()


def test_a_delay_past_the_lease_fails_instead_of_reading_released_blocks() -> None:
    senders, receivers, _, dst = pair(KVFaults(delay=1.0, delay_s=1.5), lease_s=0.5)
    try:
        before = dst.clone()
        handoff = senders.publish("r1", "tcp://127.0.0.1:9", [3, 5])
        assert receivers.fetch(handoff, [10, 0]) is None
        (release,) = poll_until(senders.poll_released)
        assert release.status is TransferStatus.FAILED  # the lease ran out first
        (result,) = poll_until(receivers.poll)
        assert result.status is TransferStatus.FAILED
        assert torch.equal(dst, before)
    finally:
        senders.close()
        receivers.close()
