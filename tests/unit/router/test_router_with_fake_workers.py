"""The router end to end against scripted workers that speak the real ZMQ/msgpack protocol."""

from __future__ import annotations

import asyncio
import json
import time

from common.wire.cache_messages import SnapshotRequest
from common.wire.messages import Abort, PrefillRequest
from tests.unit.router.fake_workers import Script
from tests.unit.router.harness import running_router, wait_for

REPLY_TEXT = " Hello 😀 世界! The end."
EOS = 2


def _reply(tokenizer) -> list[int]:
    return tokenizer.encode(REPLY_TEXT, add_special_tokens=False) + [EOS]


def _pd(tokenizer, prefill: Script | None = None, decode: Script | None = None):
    reply = _reply(tokenizer)
    prefill = prefill or Script()
    decode = decode or Script()
    prefill.reply = prefill.reply or reply
    decode.reply = decode.reply or reply
    return [("prefill-0", "prefill", prefill), ("decode-0", "decode", decode)]


def _run(model_dir, tokenizer, specs, fn, **overrides):
    async def main():
        async with running_router(model_dir, tokenizer, specs, **overrides) as h:
            return await fn(h)

    return asyncio.run(main())


def _sse_events(text: str) -> list:
    events = []
    for block in text.split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            payload = block[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def test_completion_non_stream(model_dir, tokenizer) -> None:
    async def check(h):
        r = await h.client.post("/v1/completions", json={"prompt": "Say hello", "max_tokens": 100})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
        assert body["choices"][0]["text"] == REPLY_TEXT
        assert body["choices"][0]["finish_reason"] == "stop"
        n_prompt = len(tokenizer.encode("Say hello"))
        assert body["usage"] == {
            "prompt_tokens": n_prompt,
            "completion_tokens": len(_reply(tokenizer)),
            "total_tokens": n_prompt + len(_reply(tokenizer)),
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        sent = h.worker("prefill-0").of_type(PrefillRequest)[0]
        assert sent.decode_worker_id == "decode-0" and sent.sampling.n == 1
        assert sent.decode_command_addr == h.worker("decode-0").command_addr
        assert not h.worker("prefill-0").of_type(Abort)  # the worker finished it itself
        metrics = (await h.client.get("/metrics")).text
        assert 'pdserve_requests_total{status="success"} 1' in metrics
        assert "pdserve_kv_transfer_bytes_total 1024" in metrics
        assert 'pdserve_worker_up{role="decode",worker="decode-0"} 1' in metrics
        assert 'pdserve_prefill_requests_total{worker="prefill-0"} 1' in metrics

    _run(model_dir, tokenizer, _pd(tokenizer), check)


def test_max_tokens_gives_length(model_dir, tokenizer) -> None:
    async def check(h):
        r = await h.client.post("/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 3})
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "length" and r.json()["usage"]["completion_tokens"] == 3
        r = await h.client.post("/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 1})
        assert r.json()["choices"][0]["finish_reason"] == "length"
        assert r.json()["usage"]["completion_tokens"] == 1

    _run(model_dir, tokenizer, _pd(tokenizer), check)


def test_chat_stream_with_usage(model_dir, tokenizer) -> None:
    async def check(h):
        body = {
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        r = await h.client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = _sse_events(r.text)
        assert events[-1] == "[DONE]"
        chunks = events[:-1]
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        assert text == REPLY_TEXT
        finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] == "stop"
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == len(
            _reply(tokenizer)
        )
        prompt_ids = tokenizer.encode_chat([{"role": "user", "content": "hi"}])
        assert h.worker("prefill-0").of_type(PrefillRequest)[0].prompt_token_ids == prompt_ids

    _run(model_dir, tokenizer, _pd(tokenizer), check)


def test_stop_string_ends_early_and_aborts_both_workers(model_dir, tokenizer) -> None:
    async def check(h):
        r = await h.client.post("/v1/completions", json={"prompt": "x", "stop": ["世界"], "max_tokens": 50})
        choice = r.json()["choices"][0]
        assert choice["text"] == " Hello 😀 " and choice["finish_reason"] == "stop"
        for worker_id in ("prefill-0", "decode-0"):
            await wait_for(lambda w=worker_id: h.worker(w).of_type(Abort), what=f"abort on {worker_id}")

    _run(model_dir, tokenizer, _pd(tokenizer, decode=Script(token_delay=0.01)), check)


def test_decode_tokens_arriving_before_the_first_token_are_reordered(model_dir, tokenizer) -> None:
    async def check(h):
        r = await h.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 100})
        assert r.json()["choices"][0]["text"] == REPLY_TEXT

    _run(model_dir, tokenizer, _pd(tokenizer, prefill=Script(first_token_delay=0.2)), check)


def test_prefix_routing_follows_the_cache(model_dir, tokenizer) -> None:
    reply = _reply(tokenizer)
    specs = [
        ("prefill-a", "prefill", Script(reply=reply)),
        ("prefill-b", "prefill", Script(reply=reply)),
        ("decode-0", "decode", Script(reply=reply)),
    ]
    long_prompt = list(range(1000, 1100))  # 6 full blocks of 16

    async def check(h):
        a = h.worker("prefill-a")
        a.hashes.add(0)  # make sure the snapshot path carries data too
        body = {"prompt": long_prompt, "max_tokens": 2}
        first = (await h.client.post("/v1/completions", json=body)).json()
        holder = "prefill-a" if h.worker("prefill-a").of_type(PrefillRequest) else "prefill-b"
        await wait_for(lambda: h.router.index.num_blocks(holder) >= 6, what="cache events")
        for _ in range(3):
            r = (await h.client.post("/v1/completions", json=body | {"prompt": long_prompt + [7]})).json()
            assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == 96
        assert len(h.worker(holder).of_type(PrefillRequest)) == 4
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        debug = (await h.client.get("/debug/index")).json()
        blocks = {w["worker_id"]: w.get("cached_blocks") for w in debug["workers"]}
        assert blocks[holder] >= 6

    _run(model_dir, tokenizer, specs, check)


def test_round_robin_alternates(model_dir, tokenizer) -> None:
    reply = _reply(tokenizer)
    specs = [
        ("prefill-a", "prefill", Script(reply=reply)),
        ("prefill-b", "prefill", Script(reply=reply)),
        ("decode-0", "decode", Script(reply=reply)),
    ]

    async def check(h):
        for _ in range(4):
            await h.client.post("/v1/completions", json={"prompt": list(range(1000, 1100)), "max_tokens": 2})
        assert len(h.worker("prefill-a").of_type(PrefillRequest)) == 2
        assert len(h.worker("prefill-b").of_type(PrefillRequest)) == 2

    _run(model_dir, tokenizer, specs, check, routing="round_robin")


def test_n_fans_out_with_distinct_seeds(model_dir, tokenizer) -> None:
    async def check(h):
        body = {"prompt": ["a", "b"], "n": 2, "seed": 10, "max_tokens": 4}
        r = (await h.client.post("/v1/completions", json=body)).json()
        assert [c["index"] for c in r["choices"]] == [0, 1, 2, 3]
        seeds = sorted(m.sampling.seed for m in h.worker("prefill-0").of_type(PrefillRequest))
        assert seeds == [10, 10, 11, 11]
        assert r["usage"]["completion_tokens"] == 16
        assert r["usage"]["prompt_tokens"] == len(tokenizer.encode("a")) + len(tokenizer.encode("b"))
        same = (await h.client.post("/v1/completions", json=body | {"best_of": 2})).json()  # best_of == n
        assert [c["index"] for c in same["choices"]] == [0, 1, 2, 3]

    _run(model_dir, tokenizer, _pd(tokenizer), check)


def test_retryable_failure_goes_to_another_prefill_worker(model_dir, tokenizer) -> None:
    reply = _reply(tokenizer)
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

    _run(model_dir, tokenizer, specs, check)


def test_a_request_invalid_for_the_model_is_a_400_and_not_retried(model_dir, tokenizer) -> None:
    """A worker's `invalid` failure (what only the model can check) reaches the client as a 400 with
    the worker's reason, and no other worker is tried."""
    why = "grammar is invalid for this model: too many items"
    specs = [
        ("prefill-a", "prefill", Script(fail_invalid=why)),
        ("prefill-b", "prefill", Script(fail_invalid=why)),
        ("decode-0", "decode", Script(reply=_reply(tokenizer))),
    ]

    async def check(h):
        r = await h.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3})
        assert r.status_code == 400 and r.json()["error"]["message"] == why
        r = await h.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3, "stream": True})
        assert r.status_code == 400 and r.json()["error"]["message"] == why  # no text yet: no stream
        tried = sum(len(h.worker(w).of_type(PrefillRequest)) for w in ("prefill-a", "prefill-b"))
        assert tried == 2  # one per request

    _run(model_dir, tokenizer, specs, check)


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

    _run(model_dir, tokenizer, _pd(tokenizer, prefill=Script(silent=True)), check, request_timeout=0.3)


def test_a_stream_that_began_ends_with_an_error_event(model_dir, tokenizer) -> None:
    """The 200 goes out with the first text; a failure after it (here the deadline, the decode side
    stalling) ends the stream with an error event and [DONE], and the workers are told to abort."""

    async def check(h):
        body = {"messages": [{"role": "user", "content": "x"}], "stream": True, "timeout": 0.5}
        r = await h.client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = _sse_events(r.text)
        assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert events[1]["choices"][0]["delta"]["content"]  # the prefill worker's token
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "request_timeout"
        await wait_for(lambda: h.worker("decode-0").of_type(Abort), what="abort")

    _run(model_dir, tokenizer, _pd(tokenizer, decode=Script(token_delay=5.0)), check, request_timeout=30)


def test_per_request_timeout_tightens_the_routers(model_dir, tokenizer) -> None:
    async def check(h):
        t0 = time.monotonic()
        r = await h.client.post("/v1/completions", json={"prompt": "x", "timeout": 0.3})
        assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout"
        assert time.monotonic() - t0 < 5  # well before the router's own 30 s limit
        r = await h.client.post("/v1/completions", json={"prompt": "x", "timeout": 0})
        assert r.status_code == 400 and r.json()["error"]["param"] == "timeout"

    _run(model_dir, tokenizer, _pd(tokenizer, prefill=Script(silent=True)), check, request_timeout=30)


def test_chat_logprobs(model_dir, tokenizer) -> None:
    async def check(h):
        body = {
            "messages": [{"role": "user", "content": "x"}],
            "logprobs": True,
            "top_logprobs": 1,
            "max_tokens": 3,
        }
        r = (await h.client.post("/v1/chat/completions", json=body)).json()
        content = r["choices"][0]["logprobs"]["content"]
        assert (
            len(content) == 3
            and content[0]["logprob"] == -0.25
            and content[1]["top_logprobs"][1]["logprob"] == -1.5
        )
        assert h.worker("prefill-0").of_type(PrefillRequest)[0].sampling.logprobs == 1
        body = {"prompt": "x", "logprobs": 2, "max_tokens": 3}
        lp = (await h.client.post("/v1/completions", json=body)).json()["choices"][0]["logprobs"]
        assert len(lp["tokens"]) == 3 and lp["token_logprobs"][1] == -0.5 and lp["text_offset"][0] == 0
        # vLLM's return_tokens_as_token_ids: the same tokens named by id; offsets and bytes stay the text's.
        as_ids = (
            await h.client.post("/v1/completions", json=body | {"return_tokens_as_token_ids": True})
        ).json()
        ids = as_ids["choices"][0]["logprobs"]
        sent = h.worker("decode-0").script.reply  # the scripted tokens, the first from the prefill worker
        assert ids["tokens"] == [f"token_id:{t}" for t in sent[:3]]
        assert ids["text_offset"] == lp["text_offset"] and ids["token_logprobs"] == lp["token_logprobs"]
        assert all(k.startswith("token_id:") for top in ids["top_logprobs"] for k in top)
        chat = {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 1}
        chat |= {"max_tokens": 3, "return_tokens_as_token_ids": True}
        first = (await h.client.post("/v1/chat/completions", json=chat)).json()["choices"][0]["logprobs"]
        token = first["content"][0]
        assert token["token"] == f"token_id:{sent[0]}"
        assert token["bytes"] == list(tokenizer.token_text(sent[0]).encode("utf-8"))
        assert token["top_logprobs"][0]["token"].startswith("token_id:")

    _run(model_dir, tokenizer, _pd(tokenizer), check)


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

    _run(model_dir, tokenizer, _pd(tokenizer), check, heartbeat_timeout=0.3)


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

    _run(model_dir, tokenizer, _pd(tokenizer), check)


def test_context_window_is_enforced(model_dir, tokenizer) -> None:
    async def check(h):
        r = await h.client.post("/v1/completions", json={"prompt": [5] * 100, "max_tokens": 200})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        r = await h.client.post("/v1/completions", json={"prompt": [5] * 256})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        r = await h.client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 200  # chat's default max_tokens is the rest of the window

    short = Script(max_model_len=256)
    _run(model_dir, tokenizer, _pd(tokenizer, prefill=short, decode=Script(max_model_len=256)), check)


def test_tokens_waiting_together_leave_in_one_sse_chunk(model_dir, tokenizer) -> None:
    async def check(h):
        r = await h.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 100, "stream": True})
        text_chunks = [e for e in _sse_events(r.text)[:-1] if e["choices"] and e["choices"][0]["text"]]
        # every decode token was buffered behind the late first token: one chunk carries them all
        assert len(text_chunks) == 1 and text_chunks[0]["choices"][0]["text"] == REPLY_TEXT
        assert text_chunks[0]["choices"][0]["finish_reason"] == "stop"

    _run(model_dir, tokenizer, _pd(tokenizer, prefill=Script(first_token_delay=0.3)), check)


def test_inter_token_gaps_are_a_histogram(model_dir, tokenizer) -> None:
    reply = tokenizer.encode(" one two three four", add_special_tokens=False) + [EOS]
    gap = 0.1

    async def check(h):
        r = await h.client.post("/v1/completions", json={"prompt": "Count", "max_tokens": 50, "stream": True})
        assert r.status_code == 200 and _sse_events(r.text)[-1] == "[DONE]"
        lines = (await h.client.get("/metrics")).text.splitlines()
        figure = dict(line.rsplit(" ", 1) for line in lines if line.startswith("pdserve_inter_token"))
        # The mixed worker sends each token alone, `gap` apart: one gap per token after the first.
        assert int(figure["pdserve_inter_token_latency_seconds_count"]) == len(reply) - 1
        assert float(figure["pdserve_inter_token_latency_seconds_sum"]) >= 0.9 * gap * (len(reply) - 1)

    _run(model_dir, tokenizer, [("mixed-0", "mixed", Script(reply=reply, token_delay=gap))], check)


def test_return_token_ids_gives_prompt_and_output_ids_as_vllm_places_them(model_dir, tokenizer) -> None:
    """Completions: on each choice (streamed: the prompt's once per choice, each chunk its own tokens);
    chat: the prompt's on the response (streamed: its first chunk), the output's on each choice."""
    reply = _reply(tokenizer)

    async def check(h):
        body = {"prompt": "x", "max_tokens": 64, "n": 2, "return_token_ids": True}
        r = (await h.client.post("/v1/completions", json=body)).json()
        prompt = h.worker("prefill-0").of_type(PrefillRequest)[0].prompt_token_ids
        for choice in r["choices"]:
            assert choice["prompt_token_ids"] == prompt and choice["token_ids"] == reply
        assert r["usage"]["completion_tokens"] == 2 * len(reply)
        assert (
            "token_ids"
            not in (await h.client.post("/v1/completions", json={"prompt": "x"})).json()["choices"][0]
        )
        events = _sse_events((await h.client.post("/v1/completions", json=body | {"stream": True})).text)[:-1]
        for i in (0, 1):
            mine = [c for e in events for c in e["choices"] if c["index"] == i]
            assert [t for c in mine for t in c["token_ids"]] == reply
            assert [c.get("prompt_token_ids") for c in mine if "prompt_token_ids" in c] == [prompt]
        chat = {"messages": [{"role": "user", "content": "x"}], "return_token_ids": True}
        r = (await h.client.post("/v1/chat/completions", json=chat)).json()
        chat_prompt = h.worker("prefill-0").of_type(PrefillRequest)[-1].prompt_token_ids
        assert r["prompt_token_ids"] == chat_prompt and r["choices"][0]["token_ids"] == reply
        events = _sse_events((await h.client.post("/v1/chat/completions", json=chat | {"stream": True})).text)
        assert events[0]["prompt_token_ids"] == chat_prompt
        assert not any("prompt_token_ids" in e for e in events[1:-1])
        assert [t for e in events[1:-1] for c in e["choices"] for t in c.get("token_ids", [])] == reply

    _run(model_dir, tokenizer, _pd(tokenizer), check)
