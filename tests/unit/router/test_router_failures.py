"""The router against scripted workers that fail: retries, requests invalid for the model, timeouts
(before and after the first byte), worker loss and revival, rejected registrations, the context window."""

from __future__ import annotations

import time

from common.wire.cache_messages import SnapshotRequest
from common.wire.messages import Abort, PrefillRequest
from tests.unit.router.fake_workers import Script
from tests.unit.router.harness import pd_specs, run_router, scripted_reply, sse_events, wait_for


def test_retryable_failure_goes_to_another_prefill_worker(model_dir, tokenizer) -> None:
    reply = scripted_reply(tokenizer)
    specs = [
        ("prefill-a", "prefill", Script(reply=reply, fail_retryable=True)),
        ("prefill-b", "prefill", Script(reply=reply, fail_retryable=True)),
        ("prefill-c", "prefill", Script(reply=reply)),
        ("decode-0", "decode", Script(reply=reply)),
    ]

    async def check(h):
        # prefill-c is made the most expensive so it is tried last
        h.router.registry.loads._outstanding["prefill-c"] = 10**6
        r = await h.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3})
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_workers"  # max_retries=1: a, b
        h.router.registry.loads._outstanding["prefill-c"] = 0
        h.worker("prefill-c").script.fail_retryable = True
        h.worker("prefill-a").script.fail_retryable = False
        r = await h.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3})
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"

    run_router(model_dir, tokenizer, specs, check)


def test_a_request_invalid_for_the_model_is_a_400_and_not_retried(model_dir, tokenizer) -> None:
    """A worker's `invalid` failure (what only the model can check) reaches the client as a 400 with
    the worker's reason, and no other worker is tried."""
    why = "grammar is invalid for this model: too many items"
    specs = [
        ("prefill-a", "prefill", Script(fail_invalid=why)),
        ("prefill-b", "prefill", Script(fail_invalid=why)),
        ("decode-0", "decode", Script(reply=scripted_reply(tokenizer))),
    ]

    async def check(h):
        r = await h.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3})
        assert r.status_code == 400 and r.json()["error"]["message"] == why
        r = await h.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3, "stream": True})
        assert r.status_code == 400 and r.json()["error"]["message"] == why  # no text yet: no stream
        tried = sum(len(h.worker(w).of_type(PrefillRequest)) for w in ("prefill-a", "prefill-b"))
        assert tried == 2  # one per request

    run_router(model_dir, tokenizer, specs, check)


def test_timeout_is_504_and_aborts(model_dir, tokenizer) -> None:
    async def check(h):
        r = await h.client.post("/v1/completions", json={"prompt": "x"})
        assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout"
        await wait_for(lambda: h.worker("prefill-0").of_type(Abort), what="abort")
        r = await h.client.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "stream": True}
        )
        # Nothing was streamed before the deadline, not even chat's role chunk: a plain 504.
        assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout"

    run_router(
        model_dir, tokenizer, pd_specs(tokenizer, prefill=Script(silent=True)), check, request_timeout=0.3
    )


def test_a_stream_that_began_ends_with_an_error_event(model_dir, tokenizer) -> None:
    """The 200 goes out with the first text; a failure after it (here the deadline, the decode side
    stalling) ends the stream with an error event and [DONE], and the workers are told to abort."""

    async def check(h):
        body = {"messages": [{"role": "user", "content": "x"}], "stream": True, "timeout": 0.5}
        r = await h.client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.text)
        assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert events[1]["choices"][0]["delta"]["content"]  # the prefill worker's token
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "request_timeout"
        await wait_for(lambda: h.worker("decode-0").of_type(Abort), what="abort")

    run_router(
        model_dir, tokenizer, pd_specs(tokenizer, decode=Script(token_delay=5.0)), check, request_timeout=30
    )


def test_per_request_timeout_tightens_the_routers(model_dir, tokenizer) -> None:
    async def check(h):
        t0 = time.monotonic()
        r = await h.client.post("/v1/completions", json={"prompt": "x", "timeout": 0.3})
        assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout"
        assert time.monotonic() - t0 < 5  # well before the router's own 30 s limit
        r = await h.client.post("/v1/completions", json={"prompt": "x", "timeout": 0})
        assert r.status_code == 400 and r.json()["error"]["param"] == "timeout"

    run_router(
        model_dir, tokenizer, pd_specs(tokenizer, prefill=Script(silent=True)), check, request_timeout=30
    )


def test_health_and_worker_loss(model_dir, tokenizer) -> None:
    async def check(h):
        r = await h.client.get("/health")
        assert r.status_code == 200
        assert {w["worker_id"]: w["state"] for w in r.json()["workers"]} == {
            "prefill-0": "live",
            "decode-0": "live",
        }
        prefill = h.worker("prefill-0")
        prefill.heartbeats_on = False
        await wait_for(lambda: h.router.registry.get("prefill-0").state.value == "down", what="down")
        r = await h.client.get("/health")
        assert r.status_code == 503 and r.json()["workers"][1]["state"] == "down"
        assert (await h.client.post("/v1/completions", json={"prompt": "x"})).status_code == 503
        asked = len(prefill.of_type(SnapshotRequest))
        prefill.heartbeats_on = True
        await wait_for(lambda: len(prefill.of_type(SnapshotRequest)) > asked, what="snapshot after revival")
        await wait_for(lambda: h.router.registry.is_healthy(), what="healthy again")
        assert (await h.client.get("/health")).status_code == 200

    run_router(model_dir, tokenizer, pd_specs(tokenizer), check, heartbeat_timeout=0.3)


def test_parity_mismatch_is_rejected(model_dir, tokenizer) -> None:
    from tests.unit.router.fake_workers import FakeWorker

    async def check(h):
        bad = FakeWorker("prefill-bad", "prefill", h.router.inbox_addr, Script(probe_hash=12345))
        other_bs = FakeWorker("decode-bs8", "decode", h.router.inbox_addr, Script(block_size=8))
        for w in (bad, other_bs):
            await w.start()
        try:
            await wait_for(lambda: len(h.router.registry.rejected) == 2, what="rejections")
            assert "probe_hash" in h.router.registry.rejected["prefill-bad"]
            assert "block_size" in h.router.registry.rejected["decode-bs8"]
            assert h.router.registry.get("prefill-bad") is None
            health = (await h.client.get("/health")).json()
            assert {r["worker_id"] for r in health["rejected_workers"]} == {"prefill-bad", "decode-bs8"}
        finally:
            for w in (bad, other_bs):
                await w.stop()

    run_router(model_dir, tokenizer, pd_specs(tokenizer), check)


def test_context_window_is_enforced(model_dir, tokenizer) -> None:
    async def check(h):
        r = await h.client.post("/v1/completions", json={"prompt": [5] * 100, "max_tokens": 200})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        r = await h.client.post("/v1/completions", json={"prompt": [5] * 256})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        r = await h.client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 200  # chat's default max_tokens is the rest of the window

    short = Script(max_model_len=256)
    run_router(
        model_dir, tokenizer, pd_specs(tokenizer, prefill=short, decode=Script(max_model_len=256)), check
    )
