"""The request-level half of the bad-input table (tests/unit/router/test_bad_inputs.py runs it): wrong
JSON types per field, malformed bodies, content types, missing fields, out-of-range values and refused
structured-output formats. Each case names the 4xx it must get and, where pinned, the error's param."""

from __future__ import annotations

from typing import NamedTuple

from router.protocol import ChatCompletionRequest, CompletionRequest

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


def cmpl(name: str, status: int = 400, param: object = ANY, **fields) -> Case:
    return Case(name, CMPL, {"prompt": "x"} | fields, status, param)


def chat(name: str, status: int = 400, param: object = ANY, **fields) -> Case:
    return Case(name, CHAT, {"messages": MSGS} | fields, status, param)


def raw(name: str, body: bytes, status: int = 400, headers: dict | None = None, path: str = CMPL) -> Case:
    return Case(name, path, body, status, ANY, headers)


# One wrong JSON type per field of each request model (test_bad_inputs.py checks it stays complete).
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
    "logit_bias": ["1"],
    "ignore_eos": "true",
    "include_stop_str_in_output": "yes",
    "add_special_tokens": "no",
    "truncate_prompt_tokens": "8",
    "min_tokens": 1.5,
    "skip_special_tokens": 0,
    "return_tokens_as_token_ids": "yes",
    "return_token_ids": "yes",
    "cache_salt": 5,
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
    "structured_outputs": "json",
    "timeout": "soon",
}
WRONG_TYPES_CMPL = WRONG_TYPES | {"prompt": 5, "logprobs": "1"}
WRONG_TYPES_CHAT = WRONG_TYPES | {
    "messages": "hi",
    "logprobs": "yes",
    "top_logprobs": "2",
    "continue_final_message": "yes",
    "chat_template_kwargs": ["enable_thinking"],
    "documents": "the sky is blue",
}


def wrong_type_cases() -> list[Case]:
    cases = []
    for path, base, table, model in (
        (CMPL, {"prompt": "x"}, WRONG_TYPES_CMPL, CompletionRequest),
        (CHAT, {"messages": MSGS}, WRONG_TYPES_CHAT, ChatCompletionRequest),
    ):
        for field in model.model_fields:
            cases.append(Case(f"wrong type {path} {field}", path, base | {field: table[field]}, 400, field))
    return cases


MALFORMED = [
    raw("malformed JSON", b"{not json"),
    raw("trailing comma", b'{"prompt": "x",}'),
    raw("truncated JSON", b'{"prompt": "x"'),
    raw("trailing garbage", b'{"prompt": "x"} x'),
    raw("single quotes", b"{'prompt': 'x'}"),
    raw("empty body", b""),
    raw("whitespace body", b"  \n "),
    raw("array body", b"[1, 2]"),
    raw("string body", b'"prompt"'),
    raw("number body", b"5"),
    raw("null body", b"null"),
    raw("NaN", b'{"prompt": "x", "temperature": NaN}'),
    raw("Infinity", b'{"prompt": "x", "top_p": Infinity}'),
    raw("-Infinity", b'{"prompt": "x", "presence_penalty": -Infinity}'),
    raw("NaN in an ignored field", b'{"prompt": "x", "extra": NaN}'),
    raw("nested 100000 deep", b"[" * 100_000 + b"]" * 100_000),
    raw(
        "nested 100000 deep in a field", b'{"prompt": "x", "tools": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    ),
    raw("integer of 5000 digits", b'{"prompt": "x", "seed": ' + b"9" * 5000 + b"}"),
    raw("invalid UTF-8 (0xff 0xfe)", b"\xff\xfe"),
    raw("invalid UTF-8 in a string", b'{"prompt": "a\xffb"}'),
    raw("overlong UTF-8", b'{"prompt": "\xc0\xaf"}'),
    raw("truncated UTF-8", b'{"prompt": "\xe4\xb8"}'),
    raw("UTF-16 body", '{"prompt": "x"}'.encode("utf-16")),
    raw("lone high surrogate", b'{"prompt": "\\ud800"}'),
    raw("lone low surrogate", b'{"prompt": "a\\udc00b"}'),
    raw("lone surrogate in chat", b'{"messages": [{"role": "user", "content": "\\udbff"}]}', path=CHAT),
    raw("lone surrogate in stop", b'{"prompt": "x", "stop": ["\\ud83d"]}'),
    raw("lone surrogate in a key", b'{"prompt": "x", "\\ud800": 1}'),
]

CONTENT_TYPES = [
    raw("no content type", b'{"prompt": "x"}', 415, {}),
    raw("text/plain", b'{"prompt": "x"}', 415, {"content-type": "text/plain"}),
    raw("form-urlencoded (curl -d)", b"prompt=x", 415, {"content-type": "application/x-www-form-urlencoded"}),
    raw("multipart", b"--b\r\n\r\nx\r\n--b--", 415, {"content-type": "multipart/form-data; boundary=b"}),
    raw("application/xml", b"<prompt>x</prompt>", 415, {"content-type": "application/xml"}),
    raw("JSON in latin-1", b'{"prompt": "x"}', 415, {"content-type": "application/json; charset=latin-1"}),
]

MISSING = [
    Case("completions without prompt", CMPL, {}, 400, "prompt"),
    Case("completions with only max_tokens", CMPL, {"max_tokens": 5}, 400, "prompt"),
    Case("chat without messages", CHAT, {}, 400, "messages"),
    Case("chat with prompt instead of messages", CHAT, {"prompt": "x"}, 400, "messages"),
    Case("user message without content", CHAT, {"messages": [{"role": "user"}]}, 400, "messages.0.content"),
    Case(
        "system message with null content",
        CHAT,
        {"messages": [{"role": "system", "content": None}]},
        400,
        "messages.0.content",
    ),
]

RANGES = [
    cmpl("max_tokens -1", param="max_tokens", max_tokens=-1),
    cmpl("max_tokens 0", param="max_tokens", max_tokens=0),
    cmpl("max_tokens 2**63", param="max_tokens", max_tokens=2**63),
    cmpl("max_tokens 10**6 (over the context)", param="max_tokens", max_tokens=10**6),
    chat("max_tokens huge (chat)", param="max_tokens", max_tokens=10**9),
    chat("max_completion_tokens 0", param="max_tokens", max_completion_tokens=0),
    chat("max_completion_tokens -3", param="max_tokens", max_completion_tokens=-3),
    cmpl("temperature -0.1", param="temperature", temperature=-0.1),
    cmpl("temperature 1e9", param="temperature", temperature=1e9),
    cmpl("top_p 0", param="top_p", top_p=0),
    cmpl("top_p 1.5", param="top_p", top_p=1.5),
    cmpl("top_p -1", param="top_p", top_p=-1),
    cmpl("top_k -2", param="top_k", top_k=-2),
    cmpl("top_k 2**64", param="top_k", top_k=2**64),
    cmpl("min_p -0.1", param="min_p", min_p=-0.1),
    cmpl("min_p 1.5", param="min_p", min_p=1.5),
    cmpl("n 0", param="n", n=0),
    cmpl("n -1", param="n", n=-1),
    cmpl("n 129", param="n", n=129),
    cmpl("n 10**12", param="n", n=10**12),
    cmpl("logprobs -1", param="logprobs", logprobs=-1),
    cmpl("logprobs 21", param="logprobs", logprobs=21),
    chat("top_logprobs without logprobs", param="top_logprobs", top_logprobs=2),
    chat("top_logprobs -1", param="top_logprobs", logprobs=True, top_logprobs=-1),
    chat("top_logprobs 21", param="top_logprobs", logprobs=True, top_logprobs=21),
    cmpl("presence_penalty -2.5", param="presence_penalty", presence_penalty=-2.5),
    cmpl("presence_penalty 2.5", param="presence_penalty", presence_penalty=2.5),
    cmpl("frequency_penalty -2.5", param="frequency_penalty", frequency_penalty=-2.5),
    cmpl("frequency_penalty 2.5", param="frequency_penalty", frequency_penalty=2.5),
    cmpl("repetition_penalty 0", param="repetition_penalty", repetition_penalty=0),
    cmpl("repetition_penalty -1", param="repetition_penalty", repetition_penalty=-1),
    cmpl("seed 2**64", param="seed", seed=2**64),
    cmpl("min_tokens -1", param="min_tokens", min_tokens=-1),
    cmpl("min_tokens > max_tokens", param="min_tokens", min_tokens=20, max_tokens=5),
    cmpl("stop_token_ids [-1]", param="stop_token_ids", stop_token_ids=[-1]),
    cmpl("stop_token_ids [2**64]", param="stop_token_ids.0", stop_token_ids=[2**64]),
    cmpl("stop empty string", param="stop", stop=""),
    cmpl("stop [1]", param="stop", stop=[1]),
    cmpl("stream_options without stream", param="stream_options", stream_options={"include_usage": True}),
    cmpl("bad value with stream", param="temperature", stream=True, temperature=-1),
    cmpl("echo unsupported", param="echo", echo=True),
    cmpl("suffix unsupported", param="suffix", suffix="x"),
    chat("tools unsupported", param="tools", tools=[{"type": "function"}]),
    chat("tool_choice required", param="tool_choice", tool_choice="required"),
    chat("functions unsupported", param="functions", functions=[{"name": "f"}]),
    chat("a request's chat_template", param="chat_template", chat_template="{{ messages }}"),
    cmpl("best_of 2", param="best_of", best_of=2),
    cmpl("truncate_prompt_tokens 0", param="truncate_prompt_tokens", truncate_prompt_tokens=0),
    chat("truncate_prompt_tokens -2", param="truncate_prompt_tokens", truncate_prompt_tokens=-2),
    chat("use_beam_search", param="use_beam_search", use_beam_search=True),
    cmpl("prompt_logprobs", param="prompt_logprobs", prompt_logprobs=1),
    chat("guided_whitespace_pattern", param="guided_whitespace_pattern", guided_whitespace_pattern=" "),
    cmpl("structural_tag", param="structural_tag", structural_tag='{"structures": []}'),
    cmpl("logits_processors", param="logits_processors", logits_processors=["my.module:Processor"]),
    cmpl("prompt_embeds", param="prompt_embeds", prompt_embeds="AAAA"),
    cmpl("cache_salt empty", param="cache_salt", cache_salt=""),
    chat("cache_salt too long", param="cache_salt", cache_salt="s" * 1025),
    chat(
        "continue_final_message with add_generation_prompt",
        param="continue_final_message",
        continue_final_message=True,
    ),
    Case(
        "continue_final_message of an empty message",
        CHAT,
        {
            "messages": MSGS + [{"role": "assistant", "content": ""}],
            "continue_final_message": True,
            "add_generation_prompt": False,
        },
        400,
        "continue_final_message",
    ),
    chat(
        "chat_template_kwargs naming messages",
        param="chat_template_kwargs",
        chat_template_kwargs={"messages": []},
    ),
    chat("response_format type not a string", param="response_format", response_format={"type": 5}),
]

# Structured output: a schema, regex, choice list or grammar llguidance refuses, on both endpoints.
BAD_SCHEMA = {"type": "object", "properties": {"a": {"type": "wizard"}}}
STRUCTURED = [
    case(f"{name} ({'chat' if case is chat else 'completion'})", param=param, **fields)
    for case in (cmpl, chat)
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
        ("structured_outputs empty", "structured_outputs", {"structured_outputs": {}}),
        (
            "structured_outputs two constraints",
            "structured_outputs",
            {"structured_outputs": {"regex": "a+", "choice": ["a"]}},
        ),
        ("structured_outputs unknown key", "structured_outputs", {"structured_outputs": {"regexp": "a+"}}),
        ("structured_outputs bad regex", "structured_outputs", {"structured_outputs": {"regex": "[a-z"}}),
        ("structured_outputs bad schema", "structured_outputs", {"structured_outputs": {"json": BAD_SCHEMA}}),
        (
            "structured_outputs whitespace_pattern",
            "structured_outputs",
            {"structured_outputs": {"json": {"type": "object"}, "whitespace_pattern": "[ ]?"}},
        ),
        (
            "structured_outputs option not a bool",
            "structured_outputs",
            {"structured_outputs": {"choice": ["a"], "disable_any_whitespace": "yes"}},
        ),
        (
            "structured_outputs with guided_regex",
            "structured_outputs",
            {"guided_regex": "a", "structured_outputs": {"regex": "b"}},
        ),
    )
]
