"""An authenticated router inbox (common/net/curve.py): a rogue process without the cluster's keys, or with
keys of its own, can neither register as a worker nor inject token outputs into a request's stream; the
same messages from a process holding the keys get through (real sockets, real separate processes)."""

from __future__ import annotations

import asyncio

import pytest

from common.net.curve import CurveKeys
from common.wire.messages import TokenOutput, encode
from router.cluster_client import ClusterClient
from router.config import RouterConfig
from router.prefix_index import PrefixIndex
from router.worker_registry import WorkerRegistry
from tests.helpers.registration import placeholder_register
from tests.helpers.rogues import run_rogue_async

pytestmark = pytest.mark.timeout(120)


def _register(worker_id: str) -> bytes:
    return encode(placeholder_register(worker_id, "decode"))


async def _with_router(body) -> None:
    keys = CurveKeys.generate()
    config = RouterConfig(model="unused", curve=keys)
    client = ClusterClient(config, WorkerRegistry(heartbeat_timeout=30.0), PrefixIndex())
    addr = await client.start()
    try:
        await body(client, addr, keys)
    finally:
        await client.stop()


def test_only_key_holders_can_register() -> None:
    async def body(client: ClusterClient, addr: str, keys: CurveKeys) -> None:
        for rogue in ("none", "wrong"):
            assert await run_rogue_async("push", addr, _register(f"rogue-{rogue}"), keys, rogue) == 0
        assert client.registry.workers() == []
        assert await run_rogue_async("push", addr, _register("honest"), keys, "cluster") == 0
        assert [w.worker_id for w in client.registry.workers()] == ["honest"]

    asyncio.run(_with_router(body))


def test_only_key_holders_can_send_token_outputs() -> None:
    async def body(client: ClusterClient, addr: str, keys: CurveKeys) -> None:
        await run_rogue_async("push", addr, _register("w0"), keys, "cluster")
        assert client.registry.get("w0") is not None
        stream = client.open_stream("r1")
        forged = encode(TokenOutput("r1", "w0", 0, [42], "stop", 3, 0))  # names a registered worker
        for rogue in ("none", "wrong"):
            await run_rogue_async("push", addr, forged, keys, rogue, seconds=1.0)
        assert stream.empty()
        await run_rogue_async("push", addr, forged, keys, "cluster", seconds=0.5)
        msg = (await asyncio.wait_for(stream.get_batch(), 5))[0]  # the rogue sends it repeatedly
        assert msg.token_ids == [42]

    asyncio.run(_with_router(body))
