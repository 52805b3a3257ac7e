"""/tokenize, /detokenize and /version against the router's tokenizer and its chat route."""

from __future__ import annotations

import asyncio

from common.wire.messages import PrefillRequest
from tests.unit.router.fake_workers import Script
from tests.unit.router.harness import running_router

EOS = 2
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 😀, who are you?"}]


def _run(model_dir, tokenizer, check) -> None:
    reply = tokenizer.encode(" ok", add_special_tokens=False) + [EOS]
    specs = [("prefill-0", "prefill", Script(reply=reply)), ("decode-0", "decode", Script(reply=reply))]

    async def main() -> None:
        async with running_router(model_dir, tokenizer, specs) as h:
            await check(h)

    asyncio.run(main())


def test_tokenize_a_prompt_and_back(model_dir, tokenizer) -> None:
    async def check(h) -> None:
        text = "The capital of France is 世界"
        r = await h.client.post("/tokenize", json={"prompt": text, "return_token_strs": True})
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["tokens"] == tokenizer.encode(text) and got["count"] == len(got["tokens"])
        assert got["max_model_len"] == h.router.registry.max_model_len()
        assert got["token_strs"] == [tokenizer.token_text(t) for t in got["tokens"]]
        long = "word " * 2000  # tokenized off the event loop
        r = await h.client.post("/tokenize", json={"prompt": long, "add_special_tokens": False})
        assert r.status_code == 200 and r.json()["tokens"] == tokenizer.encode(long, add_special_tokens=False)
        r = await h.client.post("/detokenize", json={"tokens": got["tokens"]})
        assert r.status_code == 200 and r.json() == {"prompt": tokenizer.decode(got["tokens"], False)}
        assert tokenizer.decode(got["tokens"]) == text

    _run(model_dir, tokenizer, check)


def test_tokenize_messages_counts_what_the_chat_route_sends(model_dir, tokenizer) -> None:
    async def check(h) -> None:
        r = await h.client.post("/tokenize", json={"messages": MESSAGES})
        assert r.status_code == 200 and r.json()["token_strs"] is None, r.text
        counted = r.json()
        r = await h.client.post("/v1/chat/completions", json={"messages": MESSAGES})
        assert r.status_code == 200, r.text
        sent = h.worker("prefill-0").of_type(PrefillRequest)[0].prompt_token_ids
        assert counted["tokens"] == sent == tokenizer.encode_chat(MESSAGES)
        assert counted["count"] == r.json()["usage"]["prompt_tokens"]

    _run(model_dir, tokenizer, check)


def test_bad_tokenize_requests_are_400s_naming_the_field(model_dir, tokenizer) -> None:
    cases = [
        ("/tokenize", {}, 400, "prompt"),
        ("/tokenize", {"prompt": 5}, 400, "prompt"),
        ("/tokenize", {"messages": []}, 400, "messages"),
        ("/tokenize", {"messages": MESSAGES, "continue_final_message": True}, 400, "continue_final_message"),
        ("/tokenize", {"prompt": "x", "model": "other"}, 404, "model"),
        ("/detokenize", {"tokens": [1, -1]}, 400, "tokens"),
        ("/detokenize", {"tokens": [10**9]}, 400, "tokens"),
        ("/detokenize", {"tokens": "1 2"}, 400, "tokens"),
        ("/detokenize", {}, 400, "tokens"),
    ]

    async def check(h) -> None:
        for path, body, status, param in cases:
            r = await h.client.post(path, json=body)
            assert r.status_code == status, (path, body, r.text)
            assert r.json()["error"]["param"] == param, (path, body, r.text)
        r = await h.client.post(
            "/tokenize", content=b"not json", headers={"content-type": "application/json"}
        )
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
        r = await h.client.get("/version")
        assert r.status_code == 200 and isinstance(r.json()["version"], str) and r.json()["version"]

    _run(model_dir, tokenizer, check)


def test_the_openapi_document_carries_the_request_bodies(model_dir, tokenizer) -> None:
    """Both routes read the body BodyGuard parsed, not a handler parameter; their schemas are still in
    /openapi.json, and every reference in the document resolves."""

    async def check(h) -> None:
        document = (await h.client.get("/openapi.json")).json()
        schemas = document["components"]["schemas"]

        def resolve(ref: dict) -> dict:
            return schemas[ref["$ref"].removeprefix("#/components/schemas/")]

        def body(path: str) -> dict:
            return document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]

        prompt, chat = (resolve(choice) for choice in body("/tokenize")["anyOf"])
        assert "prompt" in prompt["required"] and "messages" in chat["required"]
        assert resolve(body("/detokenize"))["required"] == ["tokens"]
        refs = []
        _collect_refs(document, refs)
        assert refs and all(resolve({"$ref": ref}) for ref in refs)

    _run(model_dir, tokenizer, check)


def _collect_refs(node, out: list) -> None:
    if isinstance(node, dict):
        out.extend(v for k, v in node.items() if k == "$ref")
        for value in node.values():
            _collect_refs(value, out)
    elif isinstance(node, list):
        for value in node:
            _collect_refs(value, out)
