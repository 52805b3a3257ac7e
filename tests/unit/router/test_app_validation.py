"""Every bad input gets an OpenAI-shaped 4xx; status endpoints work with no workers at all."""

from __future__ import annotations

import asyncio

import pytest

from tests.unit.router.harness import running_router

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MSGS = [{"role": "user", "content": "hi"}]


def _run(model_dir, tokenizer, fn, **overrides):
    async def main():
        async with running_router(model_dir, tokenizer, [], **overrides) as h:
            return await fn(h.client)

    return asyncio.run(main())


def _assert_openai_error(response, status: int, param: str | None = "", code: str | None = "") -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == ("invalid_request_error" if status < 429 else error["type"])
    if param != "":
        assert error["param"] == param
    if code != "":
        assert error["code"] == code
    return error


BAD_REQUESTS = [
    (COMPLETIONS, {}, "prompt"),
    (COMPLETIONS, {"prompt": ""}, "prompt"),
    (COMPLETIONS, {"prompt": []}, "prompt"),
    (COMPLETIONS, {"prompt": [[]]}, "prompt"),
    (COMPLETIONS, {"prompt": ["a", 1]}, "prompt"),
    (COMPLETIONS, {"prompt": [1, True]}, "prompt"),
    (COMPLETIONS, {"prompt": [5, 10**9]}, "prompt"),
    (COMPLETIONS, {"prompt": [-1]}, "prompt"),
    (COMPLETIONS, {"prompt": "x", "temperature": -1}, "temperature"),
    (COMPLETIONS, {"prompt": "x", "temperature": "hot"}, "temperature"),
    (COMPLETIONS, {"prompt": "x", "top_p": 0}, "top_p"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": 0}, "max_tokens"),
    (COMPLETIONS, {"prompt": "x", "max_tokens": 1.5}, "max_tokens"),
    (COMPLETIONS, {"prompt": "x", "n": 0}, "n"),
    (COMPLETIONS, {"prompt": "x", "stop": ""}, "stop"),
    (COMPLETIONS, {"prompt": "x", "stop": [1]}, "stop"),
    (COMPLETIONS, {"prompt": "x", "presence_penalty": 3}, "presence_penalty"),
    (COMPLETIONS, {"prompt": "x", "logprobs": 21}, "logprobs"),
    (COMPLETIONS, {"prompt": "x", "echo": True}, "echo"),
    (COMPLETIONS, {"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    (COMPLETIONS, {"prompt": "x", "stream": "yes"}, "stream"),
    (CHAT, {}, "messages"),
    (CHAT, {"messages": []}, "messages"),
    (CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    (CHAT, {"messages": [{"content": "x"}]}, "messages.0.role"),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    (
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        "messages.0.content",
    ),
    (CHAT, {"messages": MSGS, "top_logprobs": 2}, "top_logprobs"),
    (CHAT, {"messages": MSGS, "logprobs": True, "top_logprobs": 50}, "top_logprobs"),
    (CHAT, {"messages": MSGS, "tools": [{"type": "function"}]}, "tools"),
    (CHAT, {"messages": MSGS, "max_completion_tokens": -3}, "max_tokens"),
    (CHAT, {"messages": MSGS, "min_p": 2}, "min_p"),
    (COMPLETIONS, {"prompt": "x", "stop": "z" * 300_000}, "stop"),  # its prefix table: O(length^2)
    (CHAT, {"messages": MSGS, "stop": [str(i) for i in range(1000)]}, "stop"),
    (COMPLETIONS, {"prompt": "x", "stop_token_ids": [10**9]}, "stop_token_ids"),
    (COMPLETIONS, {"prompt": "x", "stop_token_ids": [10**9], "min_tokens": 2}, "stop_token_ids"),
    (COMPLETIONS, {"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias"),
    (COMPLETIONS, {"prompt": "x", "logit_bias": {"-1": 1}}, "logit_bias"),
    (COMPLETIONS, {"prompt": "x", "logit_bias": {"1": 1, "01": 2}}, "logit_bias"),
    (COMPLETIONS, {"prompt": "x", "logit_bias": {str(10**9): 1}}, "logit_bias"),
    (COMPLETIONS, {"prompt": "x", "logit_bias": {"5": 101}}, "logit_bias"),
    (COMPLETIONS, {"prompt": "x", "logit_bias": {"5": "up"}}, "logit_bias.5"),
    (CHAT, {"messages": MSGS, "logit_bias": [1, 2]}, "logit_bias"),
    (CHAT, {"messages": MSGS, "logit_bias": {"²": 1}}, "logit_bias"),
]


def test_bad_requests_get_400_naming_the_field(model_dir, tokenizer) -> None:
    async def check(client):
        for path, body, param in BAD_REQUESTS:
            response = await client.post(path, json=body)
            error = _assert_openai_error(response, 400)
            assert error["param"] == param, (body, error)

    _run(model_dir, tokenizer, check)


def test_malformed_bodies(model_dir, tokenizer) -> None:
    async def check(client):
        r = await client.post(COMPLETIONS, content=b"{not json", headers={"content-type": "application/json"})
        assert "JSON" in _assert_openai_error(r, 400)["message"]
        r = await client.post(COMPLETIONS, content=b"[1, 2]", headers={"content-type": "application/json"})
        _assert_openai_error(r, 400)
        r = await client.post(COMPLETIONS, content=b"\xff\xfe", headers={"content-type": "application/json"})
        _assert_openai_error(r, 400)

    _run(model_dir, tokenizer, check)


def test_unknown_model_is_404(model_dir, tokenizer) -> None:
    async def check(client):
        r = await client.post(COMPLETIONS, json={"model": "gpt-9", "prompt": "x"})
        _assert_openai_error(r, 404, param="model", code="model_not_found")
        r = await client.post(CHAT, json={"model": "gpt-9", "messages": MSGS})
        _assert_openai_error(r, 404, param="model", code="model_not_found")

    _run(model_dir, tokenizer, check)


def test_body_too_large_is_413(model_dir, tokenizer) -> None:
    async def check(client):
        r = await client.post(COMPLETIONS, json={"prompt": "x" * 5000})
        _assert_openai_error(r, 413, code="request_too_large")

        async def chunks():
            for _ in range(10):
                yield b" " * 1000  # no content-length: counted as it arrives

        r = await client.post(COMPLETIONS, content=chunks(), headers={"content-type": "application/json"})
        _assert_openai_error(r, 413)

    _run(model_dir, tokenizer, check, max_body_bytes=4096)


def test_valid_request_without_workers_is_503(model_dir, tokenizer) -> None:
    async def check(client):
        for path, body in ((COMPLETIONS, {"prompt": "hello"}), (CHAT, {"messages": MSGS, "stream": True})):
            r = await client.post(path, json=body)
            assert r.status_code == 503
            assert r.json()["error"]["code"] == "no_workers"
            assert r.headers["retry-after"] == "1"  # transient: clients are told when to retry

    _run(model_dir, tokenizer, check)


def test_status_endpoints_without_workers(model_dir, tokenizer) -> None:
    async def check(client):
        r = await client.get("/health")
        assert r.status_code == 503 and r.json()["workers"] == [] and r.json()["status"] == "unavailable"
        r = await client.get("/v1/models")
        assert r.status_code == 200
        assert r.json()["data"][0]["id"] == model_dir.name and r.json()["object"] == "list"
        r = await client.get(f"/v1/models/{model_dir.name}")  # OpenAI's client.models.retrieve
        assert r.status_code == 200 and r.json()["id"] == model_dir.name and r.json()["object"] == "model"
        _assert_openai_error(await client.get("/v1/models/other-model"), 404, code="model_not_found")
        r = await client.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        assert "# TYPE pdserve_time_to_first_token_seconds histogram" in r.text
        r = await client.get("/debug/index")
        assert r.json()["policy"] == "prefix" and r.json()["workers"] == []
        r = await client.get("/openapi.json")
        assert r.status_code == 200 and "/v1/chat/completions" in r.json()["paths"]
        _assert_openai_error(await client.get("/nope"), 404, code="not_found")
        _assert_openai_error(await client.get(COMPLETIONS), 405)

    _run(model_dir, tokenizer, check)


@pytest.mark.parametrize("name", [None, "SmolLM2-135M-Instruct"])
def test_model_name_may_be_omitted_or_served_name(model_dir, tokenizer, name) -> None:
    async def check(client):
        body = {"prompt": "x"} | ({"model": name} if name else {})
        return (await client.post(COMPLETIONS, json=body)).status_code

    assert _run(model_dir, tokenizer, check) == 503  # passed validation; no workers
