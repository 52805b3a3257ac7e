"""An authenticated KV sender (common/net/curve.py): a rogue process without the cluster's keys, or with keys
of its own, gets no reply to a fetch and releases nothing; a receiver holding the keys is served, and
one without them times out (real sockets, the rogue a real separate process)."""

from __future__ import annotations

import pytest
import torch
from kv_procs import SPECS, bits, wait_results

from common.net.curve import CurveKeys
from common.wire.codec import encode
from common.wire.kv_messages import KVFetch
from kvtransfer import KVTransferConfig, TransferStatus, create_receiver, create_sender
from kvtransfer.layout import CacheLayout
from tests.helpers.rogues import run_rogue

pytestmark = pytest.mark.timeout(120)


def test_only_key_holders_can_fetch_kv() -> None:
    keys = CurveKeys.generate()
    source = SPECS[0].make()
    sender = create_sender("tcp", source, KVTransferConfig(curve=keys))
    sender.start()
    receivers = []
    try:
        handoff = sender.publish("r", [1, 2])
        fetch = encode(KVFetch("r", 1, handoff.nonce, CacheLayout.of(source).to_wire(), 5.0))
        for rogue in ("none", "wrong"):
            assert run_rogue("fetch", handoff.address, fetch, keys, rogue, seconds=1.5) == 0  # no reply
        assert sender.poll_released() == []  # the rogues released nothing either
        assert run_rogue("fetch", handoff.address, fetch, keys, "cluster", seconds=5) == 3  # control
        sender.cancel("r")

        handoff = sender.publish("r2", [3, 4])
        for curve, want in ((None, TransferStatus.FAILED), (keys, TransferStatus.DONE)):
            cache = SPECS[0].with_(num_blocks=8, seed=5).make()
            receiver = create_receiver("tcp", cache, KVTransferConfig(curve=curve, poll_interval_s=0.01))
            receiver.start()
            receivers.append(receiver)
            receiver.fetch(handoff, [0, 1], timeout_s=1.5 if curve is None else 20)
            assert wait_results(receiver, ["r2"])["r2"].status is want
        assert torch.equal(bits(cache[:, :, [0, 1]]), bits(source[:, :, [3, 4]]))
    finally:
        for receiver in receivers:
            receiver.close()
        sender.close()
