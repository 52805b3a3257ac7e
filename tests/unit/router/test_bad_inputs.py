"""A table of bad inputs: each gets OpenAI error JSON with the right 4xx, never reaches a worker, and the
router keeps serving (a valid request afterwards gets its normal answer from the fake workers).

The table is counted (printed; run with -s to see it): docs/reliability.md quotes the count.
"""

from __future__ import annotations

import asyncio
import json
from typing import NamedTuple

from common.wire.messages import PrefillRequest
from router.protocol import ChatCompletionRequest, CompletionRequest
from tests.unit.router.fake_workers import Script
from tests.unit.router.harness import running_router

CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"
MSGS = [{"role": "user", "content": "hi"}]
JSON = {"content-type": "application/json"}
ANY = object()  # the case does not pin the error's param
MAX_MODEL_LEN = 256
MAX_BODY = 2 * 1024 * 1024
VOCAB = 49152  # SmolLM2's
EOS = 2


class Case(NamedTuple):
    name: str
    path: str
    body: dict | bytes  # bytes go out as they are (with `headers`, JSON by default)
    status: int = 400
    param: object = ANY
    headers: dict | None = None


def _cmpl(name: str, status: int = 400, param: object = ANY, **fields) -> Case:
    return Case(name, CMPL, {"prompt": "x"} | fields, status, param)


def _chat(name: str, status: int = 400, param: object = ANY, **fields) -> Case:
    return Case(name, CHAT, {"messages": MSGS} | fields, status, param)


def _raw(name: str, body: bytes, status: int = 400, headers: dict | None = None, path: str = CMPL) -> Case:
    return Case(name, path, body, status, ANY, headers)


# One wrong JSON type per field of each request model (the coverage test below keeps this complete).
WRONG_TYPES = {
    "model": 5,
    "max_tokens": "16",
    "temperature": "hot",
    "top_p": [0.5],
    "top_k": 1.5,
    "min_p": "0.1",
    "n": "2",
    "stop": 5,
    "stop_token_ids": [1.5],
    "seed": 1.5,
    "presence_penalty": "x",
    "frequency_penalty": {},
    "repetition_penalty": True,
    "ignore_eos": "true",
    "min_tokens": 1.5,
    "skip_special_tokens": 0,
    "stream": "yes",
    "stream_options": "x",
    "user": 5,
    "echo": "no",
    "suffix": 5,
    "max_completion_tokens": "5",
    "add_generation_prompt": 1,
    "tools": "x",
    "response_format": "text",
    "guided_json": 5,
    "guided_regex": 5,
    "guided_choice": "yes",
    "guided_grammar": ["start"],
    "timeout": "soon",
}
WRONG_TYPES_CMPL = WRONG_TYPES | {"prompt": 5, "logprobs": "1"}
WRONG_TYPES_CHAT = WRONG_TYPES | {"messages": "hi", "logprobs": "yes", "top_logprobs": "2"}


def _wrong_type_cases() -> list[Case]:
    cases = []
    for path, base, table, model in (
        (CMPL, {"prompt": "x"}, WRONG_TYPES_CMPL, CompletionRequest),
        (CHAT, {"messages": MSGS}, WRONG_TYPES_CHAT, ChatCompletionRequest),
    ):
        for field in model.model_fields:
            cases.append(Case(f"wrong type {path} {field}", path, base | {field: table[field]}, 400, field))
    return cases


MALFORMED = [
    _raw("malformed JSON", b"{not json"),
    _raw("trailing comma", b'{"prompt": "x",}'),
    _raw("truncated JSON", b'{"prompt": "x"'),
    _raw("trailing garbage", b'{"prompt": "x"} x'),
    _raw("single quotes", b"{'prompt': 'x'}"),
    _raw("empty body", b""),
    _raw("whitespace body", b"  \n "),
    _raw("array body", b"[1, 2]"),
    _raw("string body", b'"prompt"'),
    _raw("number body", b"5"),
    _raw("null body", b"null"),
    _raw("NaN", b'{"prompt": "x", "temperature": NaN}'),
    _raw("Infinity", b'{"prompt": "x", "top_p": Infinity}'),
    _raw("-Infinity", b'{"prompt": "x", "presence_penalty": -Infinity}'),
    _raw("NaN in an ignored field", b'{"prompt": "x", "extra": NaN}'),
    _raw("nested 100000 deep", b"[" * 100_000 + b"]" * 100_000),
    _raw(
        "nested 100000 deep in a field", b'{"prompt": "x", "tools": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    ),
    _raw("integer of 5000 digits", b'{"prompt": "x", "seed": ' + b"9" * 5000 + b"}"),
    _raw("invalid UTF-8 (0xff 0xfe)", b"\xff\xfe"),
    _raw("invalid UTF-8 in a string", b'{"prompt": "a\xffb"}'),
    _raw("overlong UTF-8", b'{"prompt": "\xc0\xaf"}'),
    _raw("truncated UTF-8", b'{"prompt": "\xe4\xb8"}'),
    _raw("UTF-16 body", '{"prompt": "x"}'.encode("utf-16")),
    _raw("lone high surrogate", b'{"prompt": "\\ud800"}'),
    _raw("lone low surrogate", b'{"prompt": "a\\udc00b"}'),
    _raw("lone surrogate in chat", b'{"messages": [{"role": "user", "content": "\\udbff"}]}', path=CHAT),
    _raw("lone surrogate in stop", b'{"prompt": "x", "stop": ["\\ud83d"]}'),
    _raw("lone surrogate in a key", b'{"prompt": "x", "\\ud800": 1}'),
]

CONTENT_TYPES = [
    _raw("no content type", b'{"prompt": "x"}', 415, {}),
    _raw("text/plain", b'{"prompt": "x"}', 415, {"content-type": "text/plain"}),
    _raw(
        "form-urlencoded (curl -d)", b"prompt=x", 415, {"content-type": "application/x-www-form-urlencoded"}
    ),
    _raw("multipart", b"--b\r\n\r\nx\r\n--b--", 415, {"content-type": "multipart/form-data; boundary=b"}),
    _raw("application/xml", b"<prompt>x</prompt>", 415, {"content-type": "application/xml"}),
    _raw("JSON in latin-1", b'{"prompt": "x"}', 415, {"content-type": "application/json; charset=latin-1"}),
]

MISSING = [
    Case("completions without prompt", CMPL, {}, 400, "prompt"),
    Case("completions with only max_tokens", CMPL, {"max_tokens": 5}, 400, "prompt"),
    Case("chat without messages", CHAT, {}, 400, "messages"),
    Case("chat with prompt instead of messages", CHAT, {"prompt": "x"}, 400, "messages"),
]

RANGES = [
    _cmpl("max_tokens -1", param="max_tokens", max_tokens=-1),
    _cmpl("max_tokens 0", param="max_tokens", max_tokens=0),
    _cmpl("max_tokens 2**63", param="max_tokens", max_tokens=2**63),
    _cmpl("max_tokens 10**6 (over the context)", param="max_tokens", max_tokens=10**6),
    _chat("max_tokens huge (chat)", param="max_tokens", max_tokens=10**9),
    _chat("max_completion_tokens 0", param="max_tokens", max_completion_tokens=0),
    _chat("max_completion_tokens -3", param="max_tokens", max_completion_tokens=-3),
    _cmpl("temperature -0.1", param="temperature", temperature=-0.1),
    _cmpl("temperature 1e9", param="temperature", temperature=1e9),
    _cmpl("top_p 0", param="top_p", top_p=0),
    _cmpl("top_p 1.5", param="top_p", top_p=1.5),
    _cmpl("top_p -1", param="top_p", top_p=-1),
    _cmpl("top_k -2", param="top_k", top_k=-2),
    _cmpl("top_k 2**64", param="top_k", top_k=2**64),
    _cmpl("min_p -0.1", param="min_p", min_p=-0.1),
    _cmpl("min_p 1.5", param="min_p", min_p=1.5),
    _cmpl("n 0", param="n", n=0),
    _cmpl("n -1", param="n", n=-1),
    _cmpl("n 129", param="n", n=129),
    _cmpl("n 10**12", param="n", n=10**12),
    _cmpl("logprobs -1", param="logprobs", logprobs=-1),
    _cmpl("logprobs 21", param="logprobs", logprobs=21),
    _chat("top_logprobs without logprobs", param="top_logprobs", top_logprobs=2),
    _chat("top_logprobs -1", param="top_logprobs", logprobs=True, top_logprobs=-1),
    _chat("top_logprobs 21", param="top_logprobs", logprobs=True, top_logprobs=21),
    _cmpl("presence_penalty -2.5", param="presence_penalty", presence_penalty=-2.5),
    _cmpl("presence_penalty 2.5", param="presence_penalty", presence_penalty=2.5),
    _cmpl("frequency_penalty -2.5", param="frequency_penalty", frequency_penalty=-2.5),
    _cmpl("frequency_penalty 2.5", param="frequency_penalty", frequency_penalty=2.5),
    _cmpl("repetition_penalty 0", param="repetition_penalty", repetition_penalty=0),
    _cmpl("repetition_penalty -1", param="repetition_penalty", repetition_penalty=-1),
    _cmpl("seed 2**64", param="seed", seed=2**64),
    _cmpl("min_tokens -1", param="min_tokens", min_tokens=-1),
    _cmpl("min_tokens > max_tokens", param="min_tokens", min_tokens=20, max_tokens=5),
    _cmpl("stop_token_ids [-1]", param="stop_token_ids", stop_token_ids=[-1]),
    _cmpl("stop_token_ids [2**64]", param="stop_token_ids.0", stop_token_ids=[2**64]),
    _cmpl("stop empty string", param="stop", stop=""),
    _cmpl("stop [1]", param="stop", stop=[1]),
    _cmpl("stream_options without stream", param="stream_options", stream_options={"include_usage": True}),
    _cmpl("bad value with stream", param="temperature", stream=True, temperature=-1),
    _cmpl("echo unsupported", param="echo", echo=True),
    _cmpl("suffix unsupported", param="suffix", suffix="x"),
    _chat("tools unsupported", param="tools", tools=[{"type": "function"}]),
    _chat("response_format type not a string", param="response_format", response_format={"type": 5}),
]

# Structured output: a schema, regex, choice list or grammar llguidance refuses, on both endpoints.
BAD_SCHEMA = {"type": "object", "properties": {"a": {"type": "wizard"}}}
STRUCTURED = [
    case(f"{name} ({'chat' if case is _chat else 'completion'})", param=param, **fields)
    for case in (_cmpl, _chat)
    for name, param, fields in (
        ("response_format type xml", "response_format", {"response_format": {"type": "xml"}}),
        ("json_schema without schema", "response_format", {"response_format": {"type": "json_schema"}}),
        (
            "json_schema bad type",
            "response_format",
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": BAD_SCHEMA}}},
        ),
        (
            "json_schema dangling $ref",
            "response_format",
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"$ref": "#/nope"}}}},
        ),
        (
            "json_schema strict not a bool",
            "response_format",
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {}, "strict": "no"}}},
        ),
        ("guided_json bad type", "guided_json", {"guided_json": BAD_SCHEMA}),
        ("guided_json not JSON", "guided_json", {"guided_json": "{not json"}),
        ("guided_json a list", "guided_json", {"guided_json": "[1, 2]"}),
        ("guided_regex unclosed class", "guided_regex", {"guided_regex": "[a-z"}),
        ("guided_regex empty", "guided_regex", {"guided_regex": ""}),
        ("guided_choice empty", "guided_choice", {"guided_choice": []}),
        ("guided_choice empty string", "guided_choice", {"guided_choice": ["yes", ""]}),
        ("guided_grammar nonsense", "guided_grammar", {"guided_grammar": "start: ((("}),
        ("min_tokens with a grammar", "min_tokens", {"guided_choice": ["a"], "min_tokens": 2}),
        ("two formats at once", "guided_choice", {"guided_regex": "a+", "guided_choice": ["a"]}),
        (
            "guided_regex with json_object",
            "guided_regex",
            {"response_format": {"type": "json_object"}, "guided_regex": "a"},
        ),
    )
]

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
    _wrong_type_cases()
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
