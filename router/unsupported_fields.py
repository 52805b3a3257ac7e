"""Request fields this server does not implement, refused when a request sets them to change the answer.

The request models ignore fields they do not know (router/protocol.py): OpenAI's clients send fields
that make no difference here (`user`, `store`, `metadata`, `service_tier`, ...). But a field that would
change the output, ignored, answers a question the client did not ask: `best_of=4` would return the
first sample, not the best of four, and `use_beam_search=true` a sampled answer.
Those are refused with a 400 naming the field, unless their value is the one that changes nothing
(as vLLM does for what its engine lacks). One table per route; it reads the parsed JSON body, before
the models drop the unknown keys.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from router.errors import bad_request


def _unset(value: Any) -> bool:
    return value is None


def _false(value: Any) -> bool:
    return value is None or value is False


def _empty(value: Any) -> bool:
    return value is None or value == [] or value == ""


def _no_tool_call(value: Any) -> bool:
    """`tool_choice` / `function_call` values that ask for no tool: what an answer without tools is."""
    return value is None or value in ("none", "auto")


def _single(value: Any) -> bool:
    return value is None or (type(value) is int and value == 1)


def _best_of_is_n(body: dict[str, Any]) -> bool:
    """`best_of` equal to `n`: n samples, all returned, which is plain sampling (as vLLM and OpenAI's
    completions read it; n itself is validated by the request model)."""
    best_of, n = body.get("best_of"), body.get("n")
    return type(best_of) is int and type(n) is int and best_of == n


# field -> whether a value leaves the answer as this server computes it. Both endpoints.
_SHARED: dict[str, Callable[[Any], bool]] = {
    "best_of": _single,
    "use_beam_search": _false,
    "prompt_logprobs": _unset,
    "allowed_token_ids": _empty,
    "bad_words": _empty,
    "logits_processors": _empty,
    "guided_whitespace_pattern": _unset,  # vLLM's; structured_outputs.whitespace_pattern is refused alike
    "structural_tag": _unset,
}
_COMPLETION = _SHARED | {"echo": _false, "suffix": _empty, "prompt_embeds": _empty}
_CHAT = _SHARED | {
    "echo": _false,
    "tools": _empty,
    "functions": _empty,
    "tool_choice": _no_tool_call,
    "function_call": _no_tool_call,
    "chat_template": _unset,  # the model's own template renders every conversation
}


# The Responses API's own fields without a meaning here: responses are not stored, no tools run.
_RESPONSES = {
    "previous_response_id": _unset,
    "conversation": _unset,
    "background": _false,
    "prompt": _unset,  # a stored prompt template
    "tools": _empty,
    "tool_choice": _no_tool_call,
    "top_logprobs": lambda value: value is None or value == 0,
}
_BY_ROUTE = {"/v1/completions": _COMPLETION, "/v1/chat/completions": _CHAT, "/v1/responses": _RESPONSES}


def refuse_unsupported(body: dict[str, Any], route: str) -> None:
    """Raise a 400 naming the first field of `body` (a parsed request to `route`) that asks for what
    this server does not do."""
    for name, leaves_answer in _BY_ROUTE[route].items():
        if name in body and not leaves_answer(body[name]) and not _neutral_in(body, name):
            raise bad_request(f"{name} is not supported", param=name)


# field -> a rule over the whole body under which its value changes nothing after all.
_IN_CONTEXT: dict[str, Callable[[dict[str, Any]], bool]] = {"best_of": _best_of_is_n}


def _neutral_in(body: dict[str, Any], name: str) -> bool:
    rule = _IN_CONTEXT.get(name)
    return rule is not None and rule(body)
