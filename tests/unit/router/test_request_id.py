"""`X-Request-Id`: echoed when the client sends one, generated when it does not, on every answer."""

from __future__ import annotations

import asyncio
import re

from common.wire.messages import PrefillRequest
from tests.unit.router.fake_workers import Script
from tests.unit.router.harness import running_router

BODY = {"prompt": "Say hello", "max_tokens": 4}


def _run(model_dir, tokenizer, fn, **overrides):
    reply = tokenizer.encode(" Hello there", add_special_tokens=False) + [2]
    specs = [("prefill-0", "prefill", Script(reply=reply)), ("decode-0", "decode", Script(reply=reply))]

    async def main():
        async with running_router(model_dir, tokenizer, specs, **overrides) as h:
            return await fn(h.client)

    return asyncio.run(main())


def test_a_clients_id_is_echoed_on_every_kind_of_answer(model_dir, tokenizer) -> None:
    async def check(client):
        rid = {"X-Request-Id": "trace-7f3a:01/b"}
        ok = await client.post("/v1/completions", json=BODY, headers=rid)
        streamed = await client.post("/v1/completions", json={**BODY, "stream": True}, headers=rid)
        chat = await client.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}, headers=rid
        )
        invalid = await client.post("/v1/completions", json={**BODY, "temperature": -1}, headers=rid)
        unknown = await client.get("/v1/nowhere", headers=rid)
        health = await client.get("/health", headers=rid)
        return ok, streamed, chat, invalid, unknown, health

    answers = _run(model_dir, tokenizer, check)
    assert [r.status_code for r in answers] == [200, 200, 200, 400, 404, 200]
    for r in answers:
        assert r.headers["x-request-id"] == "trace-7f3a:01/b"
    assert answers[0].json()["choices"][0]["text"] == " Hello there"
    assert "data: [DONE]" in answers[1].text


def test_an_id_is_generated_per_request_when_absent(model_dir, tokenizer) -> None:
    async def check(client):
        return [await client.post("/v1/completions", json=BODY) for _ in range(2)]

    first, second = _run(model_dir, tokenizer, check)
    ids = [first.headers["x-request-id"], second.headers["x-request-id"]]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids) and ids[0] != ids[1]


def test_an_unusable_id_is_a_400_naming_the_header_and_the_router_keeps_serving(model_dir, tokenizer) -> None:
    async def check(client):
        bad = [
            await client.post("/v1/completions", json=BODY, headers={"X-Request-Id": value})
            for value in ("x" * 129, "has space", "tab\there")
        ]
        return bad, await client.post("/v1/completions", json=BODY, headers={"X-Request-Id": "x" * 128})

    bad, good = _run(model_dir, tokenizer, check)
    for r in bad:
        assert r.status_code == 400 and r.json()["error"]["param"] == "X-Request-Id", r.text
        assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"])  # not the refused value
    assert good.status_code == 200 and good.headers["x-request-id"] == "x" * 128


def test_answers_refused_before_the_app_carry_the_id_too(model_dir, tokenizer) -> None:
    async def check(client):
        headers = {"X-Request-Id": "auth-check"}
        unauthorized = await client.post("/v1/completions", json=BODY, headers=headers)
        too_large = await client.post(
            "/v1/completions",
            content=b'{"prompt": "' + b"x" * 4096 + b'"}',
            headers={**headers, "Authorization": "Bearer k", "content-type": "application/json"},
        )
        return unauthorized, too_large

    unauthorized, too_large = _run(model_dir, tokenizer, check, api_key="k", max_body_bytes=1024)
    assert (unauthorized.status_code, too_large.status_code) == (401, 413)
    assert unauthorized.headers["x-request-id"] == too_large.headers["x-request-id"] == "auth-check"


def test_the_id_travels_to_the_workers(model_dir, tokenizer) -> None:
    """Workers name it in their log lines (common/wire/request_log.py): every sub-request carries it."""
    reply = tokenizer.encode(" Hi", add_special_tokens=False) + [2]
    specs = [("prefill-0", "prefill", Script(reply=reply)), ("decode-0", "decode", Script(reply=reply))]

    async def main():
        async with running_router(model_dir, tokenizer, specs) as h:
            r = await h.client.post(
                "/v1/completions", json={**BODY, "n": 2}, headers={"X-Request-Id": "trace-9"}
            )
            assert r.status_code == 200, r.text
            plain = await h.client.post("/v1/completions", json=BODY)
            return h.worker("prefill-0").of_type(PrefillRequest), plain.headers["x-request-id"]

    sent, generated = asyncio.run(main())
    assert [m.log_id for m in sent] == ["trace-9", "trace-9", generated]
