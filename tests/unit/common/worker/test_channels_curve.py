"""A worker's authenticated sockets (common/net/curve.py): a rogue process without the cluster's keys, or
with keys of its own, cannot put a command on a worker's command socket; a process holding the keys can
(real sockets, the rogue a real separate process)."""

from __future__ import annotations

import queue

import pytest

from common.net.curve import CurveKeys
from common.wire.messages import Abort, Shutdown, encode
from common.worker.channels import WorkerChannels
from tests.helpers.rogues import run_rogue

pytestmark = pytest.mark.timeout(120)


def test_only_key_holders_can_command_a_worker() -> None:
    keys = CurveKeys.generate()
    channels = WorkerChannels("w0", "tcp://127.0.0.1:9", "127.0.0.1", with_events=True, curve=keys)
    addresses = channels.start()
    try:
        for rogue in ("none", "wrong"):
            run_rogue("push", addresses.command_addr, encode(Shutdown("rogue")), keys, rogue, seconds=1.0)
        with pytest.raises(queue.Empty):
            channels.inbox.get(timeout=0.5)
        run_rogue("push", addresses.command_addr, encode(Abort("r1")), keys, "cluster", seconds=0.5)
        assert channels.inbox.get(timeout=5) == Abort("r1")
    finally:
        channels.close()
