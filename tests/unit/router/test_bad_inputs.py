"""A table of bad inputs: each gets OpenAI error JSON with the right 4xx, never reaches a worker, and the
router keeps serving (a valid request afterwards gets its normal answer from the fake workers). The
request-level cases are in bad_input_cases.py; the prompt, message and routing ones are here.

The table is counted (printed; run with -s to see it): docs/reliability.md quotes the count.
"""

from __future__ import annotations

import asyncio
import json

from common.wire.messages import PrefillRequest
from router.protocol import ChatCompletionRequest, CompletionRequest
from tests.unit.router.bad_input_cases import (
    ANY,
    CHAT,
    CMPL,
    CONTENT_TYPES,
    EOS,
    JSON,
    MALFORMED,
    MAX_BODY,
    MAX_MODEL_LEN,
    MISSING,
    MSGS,
    RANGES,
    STRUCTURED,
    VOCAB,
    WRONG_TYPES_CHAT,
    WRONG_TYPES_CMPL,
    Case,
    wrong_type_cases,
)
from tests.unit.router.fake_workers import Script
from tests.unit.router.harness import running_router

PROMPTS = [
    Case("empty prompt string", CMPL, {"prompt": ""}, 400, "prompt"),
    Case("empty prompt list", CMPL, {"prompt": []}, 400, "prompt"),
    Case("empty token list in a batch", CMPL, {"prompt": [[1], []]}, 400, "prompt"),
    Case("mixed strings and ints", CMPL, {"prompt": ["a", 1]}, 400, "prompt"),
    Case("token id -1", CMPL, {"prompt": [5, -1]}, 400, "prompt"),
    Case("token id == vocab size", CMPL, {"prompt": [VOCAB]}, 400, "prompt"),
    Case("token id 10**30", CMPL, {"prompt": [10**30]}, 400, "prompt"),
    Case("token id 1.5", CMPL, {"prompt": [1, 1.5]}, 400, "prompt"),
    Case("token id true", CMPL, {"prompt": [1, True]}, 400, "prompt"),
    Case("token id null", CMPL, {"prompt": [1, None]}, 400, "prompt"),
    Case("token id -1 in a batch", CMPL, {"prompt": [[1], [-1]]}, 400, "prompt"),
    Case("prompt object", CMPL, {"prompt": {"text": "x"}}, 400, "prompt"),
    Case("prompt over the context (text)", CMPL, {"prompt": "hello " * 400}, 400, "prompt"),
    Case("prompt over the context (ids)", CMPL, {"prompt": [5] * (MAX_MODEL_LEN + 1)}, 400, "prompt"),
    Case(
        "prompt + max_tokens over the context",
        CMPL,
        {"prompt": [5] * 200, "max_tokens": 100},
        400,
        "max_tokens",
    ),
    Case("5000 prompts x n=2", CMPL, {"prompt": [[1]] * 5000, "n": 2}, 400, "prompt"),
    Case("1M-char prompt", CMPL, {"prompt": "x" * 1_000_000}, 400, "prompt"),
    Case(
        "1M-char chat message",
        CHAT,
        {"messages": [{"role": "user", "content": "y" * 1_000_000}]},
        400,
        "messages",  # refused before tokenizing (the text cannot fit the window)
    ),
    Case("1M-char model name", CMPL, {"prompt": "x", "model": "m" * 1_000_000}, 404, "model"),
]

MESSAGES = [
    Case("empty messages", CHAT, {"messages": []}, 400, "messages"),
    Case("messages not a list", CHAT, {"messages": {"role": "user"}}, 400, "messages"),
    Case("message is a string", CHAT, {"messages": ["hi"]}, 400, "messages.0"),
    Case("message is a number", CHAT, {"messages": [5]}, 400, "messages.0"),
    Case("message without role", CHAT, {"messages": [{"content": "x"}]}, 400, "messages.0.role"),
    Case("role wizard", CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.0.role"),
    Case("role empty", CHAT, {"messages": [{"role": "", "content": "x"}]}, 400, "messages.0.role"),
    Case("role USER", CHAT, {"messages": [{"role": "USER", "content": "x"}]}, 400, "messages.0.role"),
    Case("role null", CHAT, {"messages": [{"role": None, "content": "x"}]}, 400, "messages.0.role"),
    Case("content number", CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "messages.0.content"),
    Case(
        "content object",
        CHAT,
        {"messages": [{"role": "user", "content": {"t": 1}}]},
        400,
        "messages.0.content",
    ),
    Case(
        "content part w/o text",
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
        400,
        ANY,
    ),
    Case(
        "content part number",
        CHAT,
        {"messages": [{"role": "user", "content": [5]}]},
        400,
        "messages.0.content",
    ),
    Case(
        "image content part",
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        400,
        "messages.0.content",
    ),
    Case(
        "name number",
        CHAT,
        {"messages": [{"role": "user", "content": "x", "name": 5}]},
        400,
        "messages.0.name",
    ),
    Case(
        "second message bad",
        CHAT,
        {"messages": [*MSGS, {"role": "x", "content": "y"}]},
        400,
        "messages.1.role",
    ),
]

OTHER = [
    Case("unknown model", CMPL, {"prompt": "x", "model": "gpt-9"}, 404, "model"),
    Case("unknown model (chat)", CHAT, {"messages": MSGS, "model": "gpt-9"}, 404, "model"),
    Case("empty model name", CMPL, {"prompt": "x", "model": ""}, 404, "model"),
    Case("oversize body", CMPL, {"prompt": "x" * (MAX_BODY + 1)}, 413),
    Case("oversize chat body", CHAT, {"messages": [{"role": "user", "content": "x" * (MAX_BODY + 1)}]}, 413),
    Case("unknown route", "/v1/nothing", {"prompt": "x"}, 404),
]

CASES = (
    wrong_type_cases()
    + MALFORMED
    + CONTENT_TYPES
    + MISSING
    + RANGES
    + STRUCTURED
    + PROMPTS
    + MESSAGES
    + OTHER
)


def test_wrong_type_table_covers_every_field() -> None:
    assert set(CompletionRequest.model_fields) <= set(WRONG_TYPES_CMPL)
    assert set(ChatCompletionRequest.model_fields) <= set(WRONG_TYPES_CHAT)


def test_bad_inputs_get_openai_errors_and_the_router_keeps_serving(model_dir, tokenizer) -> None:
    print(f"\nbad-input cases: {len(CASES)}")
    assert len({c.name for c in CASES}) == len(CASES), "case names must be unique"
    failures = asyncio.run(_run_cases(model_dir, tokenizer))
    assert not failures, "\n".join(failures)


async def _run_cases(model_dir, tokenizer) -> list[str]:
    reply = tokenizer.encode(" ok", add_special_tokens=False) + [EOS]
    script = dict(reply=reply, max_model_len=MAX_MODEL_LEN)
    specs = [("prefill-0", "prefill", Script(**script)), ("decode-0", "decode", Script(**script))]
    # A generous heartbeat timeout: tokenizing the 1M-character cases holds the event loop (and so the
    # heartbeats) for ~0.5 s each on a busy CI core; that is not what this test is about.
    overrides = dict(max_body_bytes=MAX_BODY, heartbeat_timeout=30.0)
    async with running_router(model_dir, tokenizer, specs, **overrides) as h:
        failures = [f"{case.name}: {problem}" for case in CASES if (problem := await _check(h.client, case))]
        assert not h.worker("prefill-0").of_type(PrefillRequest), "a bad request reached a worker"
        assert h.router.running == 0
        r = await h.client.post(CMPL, json={"prompt": "Say hello", "max_tokens": 5})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == " ok", r.text
        assert (await h.client.get("/health")).status_code == 200
    return failures


async def _check(client, case: Case) -> str | None:
    if isinstance(case.body, bytes):
        headers = JSON if case.headers is None else case.headers
        r = await client.post(case.path, content=case.body, headers=headers)
    else:
        r = await client.post(case.path, json=case.body)
    if r.status_code != case.status:
        return f"status {r.status_code} != {case.status}: {r.text[:200]}"
    return _error_shape_problem(r, case)


def _error_shape_problem(r, case: Case) -> str | None:
    try:
        error = r.json()["error"]
    except (ValueError, KeyError, TypeError):
        return f"not OpenAI error JSON: {r.text[:200]}"
    if set(error) != {"message", "type", "param", "code"} or not isinstance(error["message"], str):
        return f"bad error keys: {json.dumps(error)[:200]}"
    if error["type"] != "invalid_request_error":
        return f"type {error['type']!r}"
    if len(r.content) > 4096:
        return f"error body of {len(r.content)} bytes (echoes the input?)"
    if case.param is not ANY and not str(error["param"]).startswith(str(case.param)):
        return f"param {error['param']!r} != {case.param!r}"
    return None
