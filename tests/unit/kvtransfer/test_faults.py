"""kvtransfer.faults: the registry's "faults" wrapper, switched on by PDSERVE_KV_FAULTS (validated, off by
default, its module not even loaded then), in front of a receiver set moving blocks over real tcp
sockets: a dropped fetch fails after the delay and the sender's blocks come back through the lease; a
delayed one arrives intact, late."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch
from kv_procs import CacheSpec

from kvtransfer import KVTransferConfig, TransferStatus, create_receiver, create_sender
from kvtransfer.faults import FaultyReceiver, KVFaults
from kvtransfer.peers import KVReceiverSet, KVSenderSet
from kvtransfer.registry import KV_FAULTS_ENV
from kvtransfer.tcp import TcpReceiver, TcpSender
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


def test_off_unless_the_variable_is_set(monkeypatch) -> None:
    cache = CacheSpec(num_blocks=4).make()
    monkeypatch.delenv(KV_FAULTS_ENV, raising=False)
    assert type(create_receiver("tcp", cache)) is TcpReceiver
    monkeypatch.setenv(KV_FAULTS_ENV, "  ")
    assert type(create_receiver("tcp", cache)) is TcpReceiver
    monkeypatch.setenv(KV_FAULTS_ENV, "drop=1")
    faulty = create_receiver("tcp", cache)
    assert isinstance(faulty, FaultyReceiver) and faulty.faults.drop == 1.0
    assert type(faulty.inner) is TcpReceiver and faulty.transport == "tcp"  # the rest is the transport's
    assert type(create_sender("tcp", cache)) is TcpSender  # faults are the fetching side's
    monkeypatch.setenv(KV_FAULTS_ENV, "nonsense")
    with pytest.raises(ValueError, match=KV_FAULTS_ENV):
        create_receiver("tcp", cache)


def test_production_imports_do_not_load_the_fault_injector() -> None:
    code = "import sys, decode_worker.role, kvtransfer.peers; print('kvtransfer.faults' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if k != KV_FAULTS_ENV}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_the_choice_is_per_request_and_reproducible() -> None:
    faults = KVFaults(drop=0.2, delay=0.3, seed=5)
    ids = [f"req-{i}" for i in range(2000)]
    picks = [faults.choose(r) for r in ids]
    assert picks == [faults.choose(r) for r in ids]  # same seed and id, same fault
    assert abs(picks.count("drop") / len(ids) - 0.2) < 0.04
    assert abs(picks.count("delay") / len(ids) - 0.3) < 0.04
    assert picks != [KVFaults(drop=0.2, delay=0.3, seed=6).choose(r) for r in ids]
    assert {KVFaults().choose(r) for r in ids} == {None}


@pytest.fixture
def pair(monkeypatch):
    def make(faults: KVFaults, lease_s: float = 5.0):
        src, dst = CacheSpec(num_blocks=16).make(), CacheSpec(num_blocks=16, seed=7).make()
        senders = KVSenderSet(src, KVTransferConfig(transport="tcp", host="127.0.0.1", lease_s=lease_s))
        monkeypatch.setenv(KV_FAULTS_ENV, faults.to_env())  # read as the receiver set starts its receivers
        receivers = KVReceiverSet(dst, KVTransferConfig(transport="tcp", fetch_timeout_s=5.0))
        senders.start()
        receivers.start()
        return senders, receivers, src, dst

    return make


def test_a_dropped_fetch_fails_late_and_the_lease_frees_the_sender(pair) -> None:
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


def test_a_delayed_fetch_arrives_intact_after_the_delay(pair) -> None:
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


def test_a_delay_past_the_lease_fails_instead_of_reading_released_blocks(pair) -> None:
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
