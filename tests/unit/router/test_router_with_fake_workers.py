"""The router end to end against scripted workers that speak the real ZMQ/msgpack protocol: answers,
streams, routing, sampling fields (failures, timeouts and worker health: test_router_failures.py)."""

from __future__ import annotations

from common.wire.messages import Abort, PrefillRequest
from tests.unit.router.fake_workers import Script
from tests.unit.router.harness import (
    EOS,
    REPLY_TEXT,
    pd_specs,
    run_router,
    scripted_reply,
    sse_events,
    wait_for,
)


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
            "completion_tokens": len(scripted_reply(tokenizer)),
            "total_tokens": n_prompt + len(scripted_reply(tokenizer)),
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

    run_router(model_dir, tokenizer, pd_specs(tokenizer), check)


def test_max_tokens_gives_length(model_dir, tokenizer) -> None:
    async def check(h):
        r = await h.client.post("/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 3})
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "length" and r.json()["usage"]["completion_tokens"] == 3
        r = await h.client.post("/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 1})
        assert r.json()["choices"][0]["finish_reason"] == "length"
        assert r.json()["usage"]["completion_tokens"] == 1

    run_router(model_dir, tokenizer, pd_specs(tokenizer), check)


def test_chat_stream_with_usage(model_dir, tokenizer) -> None:
    async def check(h):
        body = {
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        r = await h.client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.text)
        assert events[-1] == "[DONE]"
        chunks = events[:-1]
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        assert text == REPLY_TEXT
        finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] == "stop"
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == len(
            scripted_reply(tokenizer)
        )
        prompt_ids = tokenizer.encode_chat([{"role": "user", "content": "hi"}])
        assert h.worker("prefill-0").of_type(PrefillRequest)[0].prompt_token_ids == prompt_ids

    run_router(model_dir, tokenizer, pd_specs(tokenizer), check)


def test_stop_string_ends_early_and_aborts_both_workers(model_dir, tokenizer) -> None:
    async def check(h):
        r = await h.client.post("/v1/completions", json={"prompt": "x", "stop": ["世界"], "max_tokens": 50})
        choice = r.json()["choices"][0]
        assert choice["text"] == " Hello 😀 " and choice["finish_reason"] == "stop"
        for worker_id in ("prefill-0", "decode-0"):
            await wait_for(lambda w=worker_id: h.worker(w).of_type(Abort), what=f"abort on {worker_id}")

    run_router(model_dir, tokenizer, pd_specs(tokenizer, decode=Script(token_delay=0.01)), check)


def test_decode_tokens_arriving_before_the_first_token_are_reordered(model_dir, tokenizer) -> None:
    async def check(h):
        r = await h.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 100})
        assert r.json()["choices"][0]["text"] == REPLY_TEXT

    run_router(model_dir, tokenizer, pd_specs(tokenizer, prefill=Script(first_token_delay=0.2)), check)


def test_prefix_routing_follows_the_cache(model_dir, tokenizer) -> None:
    reply = scripted_reply(tokenizer)
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

    run_router(model_dir, tokenizer, specs, check)


def test_round_robin_alternates(model_dir, tokenizer) -> None:
    reply = scripted_reply(tokenizer)
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

    run_router(model_dir, tokenizer, specs, check, routing="round_robin")


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

    run_router(model_dir, tokenizer, pd_specs(tokenizer), check)


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

    run_router(model_dir, tokenizer, pd_specs(tokenizer), check)


def test_tokens_waiting_together_leave_in_one_sse_chunk(model_dir, tokenizer) -> None:
    async def check(h):
        r = await h.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 100, "stream": True})
        text_chunks = [e for e in sse_events(r.text)[:-1] if e["choices"] and e["choices"][0]["text"]]
        # every decode token was buffered behind the late first token: one chunk carries them all
        assert len(text_chunks) == 1 and text_chunks[0]["choices"][0]["text"] == REPLY_TEXT
        assert text_chunks[0]["choices"][0]["finish_reason"] == "stop"

    run_router(model_dir, tokenizer, pd_specs(tokenizer, prefill=Script(first_token_delay=0.3)), check)


def test_inter_token_gaps_are_a_histogram(model_dir, tokenizer) -> None:
    reply = tokenizer.encode(" one two three four", add_special_tokens=False) + [EOS]
    gap = 0.1

    async def check(h):
        r = await h.client.post("/v1/completions", json={"prompt": "Count", "max_tokens": 50, "stream": True})
        assert r.status_code == 200 and sse_events(r.text)[-1] == "[DONE]"
        lines = (await h.client.get("/metrics")).text.splitlines()
        figure = dict(line.rsplit(" ", 1) for line in lines if line.startswith("pdserve_inter_token"))
        # The mixed worker sends each token alone, `gap` apart: one gap per token after the first.
        assert int(figure["pdserve_inter_token_latency_seconds_count"]) == len(reply) - 1
        assert float(figure["pdserve_inter_token_latency_seconds_sum"]) >= 0.9 * gap * (len(reply) - 1)

    run_router(model_dir, tokenizer, [("mixed-0", "mixed", Script(reply=reply, token_delay=gap))], check)


def test_return_token_ids_gives_prompt_and_output_ids_as_vllm_places_them(model_dir, tokenizer) -> None:
    """Completions: on each choice (streamed: the prompt's once per choice, each chunk its own tokens);
    chat: the prompt's on the response (streamed: its first chunk), the output's on each choice."""
    reply = scripted_reply(tokenizer)

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
        events = sse_events((await h.client.post("/v1/completions", json=body | {"stream": True})).text)[:-1]
        for i in (0, 1):
            mine = [c for e in events for c in e["choices"] if c["index"] == i]
            assert [t for c in mine for t in c["token_ids"]] == reply
            assert [c.get("prompt_token_ids") for c in mine if "prompt_token_ids" in c] == [prompt]
        chat = {"messages": [{"role": "user", "content": "x"}], "return_token_ids": True}
        r = (await h.client.post("/v1/chat/completions", json=chat)).json()
        chat_prompt = h.worker("prefill-0").of_type(PrefillRequest)[-1].prompt_token_ids
        assert r["prompt_token_ids"] == chat_prompt and r["choices"][0]["token_ids"] == reply
        events = sse_events((await h.client.post("/v1/chat/completions", json=chat | {"stream": True})).text)
        assert events[0]["prompt_token_ids"] == chat_prompt
        assert not any("prompt_token_ids" in e for e in events[1:-1])
        assert [t for e in events[1:-1] for c in e["choices"] for t in c.get("token_ids", [])] == reply

    run_router(model_dir, tokenizer, pd_specs(tokenizer), check)
