"""The worker-facing side: event gaps trigger snapshots, restarts fail over in-flight requests."""

from __future__ import annotations

import asyncio
import dataclasses

from common.wire.cache_messages import SnapshotRequest
from common.wire.hashing import block_hashes
from common.wire.kv_events import BlockRemoved, BlockStored
from common.wire.messages import PrefillRequest, Shutdown, TokenOutput, encode
from tests.unit.router.fake_workers import Script
from tests.unit.router.harness import run_router, wait_for


def test_event_gap_triggers_a_snapshot(model_dir, tokenizer) -> None:
    hashes = block_hashes(list(range(64)), 16)
    specs = [("p0", "prefill", Script(reply=[5, 2])), ("d0", "decode", Script(reply=[5, 2]))]

    async def check(h):
        p0 = h.worker("p0")
        await wait_for(lambda: p0.of_type(SnapshotRequest), what="join snapshot")
        asked = len(p0.of_type(SnapshotRequest))
        p0.hashes.update(hashes)
        p0.seq += 5  # batches the router never saw
        await p0.publish([BlockStored(tuple(hashes), None)])
        await wait_for(lambda: len(p0.of_type(SnapshotRequest)) > asked, what="snapshot after the gap")
        await wait_for(lambda: not h.router.index.awaiting_snapshot("p0"), what="snapshot applied")
        assert h.router.index.match(hashes) == {"p0": 4}
        await p0.publish([BlockRemoved(tuple(hashes[2:]))])
        await wait_for(lambda: h.router.index.match(hashes) == {"p0": 2}, what="removal applied")

    run_router(model_dir, tokenizer, specs, check)


def test_garbage_on_the_inbox_is_ignored(model_dir, tokenizer) -> None:
    specs = [("p0", "prefill", Script(reply=[5, 2])), ("d0", "decode", Script(reply=[5, 2]))]

    async def check(h):
        p0 = h.worker("p0")
        await p0._push.send(b"\x00garbage")
        await p0._push.send(encode(SnapshotRequest("p0")))  # valid message, wrong direction
        await p0._pub.send(b"not an event")
        r = await h.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2

    run_router(model_dir, tokenizer, specs, check)


def test_outputs_from_unknown_workers_are_dropped(model_dir, tokenizer) -> None:
    specs = [("p0", "prefill", Script(reply=[5, 2])), ("d0", "decode", Script(reply=[5, 2]))]

    async def check(h):
        queue = h.router.cluster.open_stream("req-x")
        p0 = h.worker("p0")
        await p0._push.send(encode(TokenOutput("req-x", "ghost", 0, [7], None, 1, 0)))  # not registered
        await p0._push.send(encode(TokenOutput("req-x", "p0", 0, [8], None, 1, 0)))
        [first] = await asyncio.wait_for(queue.get_batch(), timeout=5)
        assert first.worker_id == "p0" and first.token_ids == [8] and queue.empty()

    run_router(model_dir, tokenizer, specs, check)


def test_restarted_worker_fails_over_in_flight_requests(model_dir, tokenizer) -> None:
    reply = tokenizer.encode(" fine", add_special_tokens=False) + [2]
    specs = [
        ("p-stuck", "prefill", Script(reply=reply, silent=True)),
        ("p-ok", "prefill", Script(reply=reply)),
        ("d0", "decode", Script(reply=reply)),
    ]

    async def check(h):
        h.router.registry.loads._outstanding["p-ok"] = 10**6  # steer the first attempt to p-stuck
        stuck = h.worker("p-stuck")
        request = asyncio.create_task(h.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 5}))
        await wait_for(lambda: stuck.of_type(PrefillRequest), what="dispatch to p-stuck")
        h.router.registry.loads._outstanding["p-ok"] = 0
        restarted = dataclasses.replace(stuck.registration(), pid=stuck.registration().pid + 1)
        await stuck.send(restarted)
        r = await request
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == " fine"
        retried = h.worker("p-ok").of_type(PrefillRequest)
        assert len(retried) == 1 and retried[0].request_id.endswith("~retry1")
        assert "pdserve_retries_total 1" in (await h.client.get("/metrics")).text

    run_router(model_dir, tokenizer, specs, check)


def test_shutdown_workers(model_dir, tokenizer) -> None:
    specs = [("p0", "prefill", Script(reply=[5, 2])), ("d0", "decode", Script(reply=[5, 2]))]

    async def check(h):
        assert await h.router.cluster.shutdown_workers("bye") == 2
        for w in h.workers:
            await wait_for(lambda w=w: w.of_type(Shutdown), what=f"shutdown of {w.worker_id}")
            assert w.of_type(Shutdown)[0].reason == "bye"

    run_router(model_dir, tokenizer, specs, check)
