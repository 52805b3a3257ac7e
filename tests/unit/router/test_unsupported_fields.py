"""Fields that would change the answer are refused unless set to the value that changes nothing."""

from __future__ import annotations

import pytest

from router.errors import APIError
from router.unsupported_fields import refuse_unsupported

CMPL, CHAT, RESP = "/v1/completions", "/v1/chat/completions", "/v1/responses"

REFUSED = [
    (CMPL, {"best_of": 2}),
    (CMPL, {"best_of": True}),
    (CMPL, {"use_beam_search": True}),
    (CMPL, {"prompt_logprobs": 0}),
    (CMPL, {"allowed_token_ids": [1, 2]}),
    (CMPL, {"bad_words": ["x"]}),
    (CMPL, {"echo": True}),
    (CMPL, {"suffix": "x"}),
    (CHAT, {"tools": [{"type": "function"}]}),
    (CHAT, {"functions": [{"name": "f"}]}),
    (CHAT, {"tool_choice": "required"}),
    (CHAT, {"tool_choice": {"type": "function", "function": {"name": "f"}}}),
    (CHAT, {"function_call": {"name": "f"}}),
    (CHAT, {"chat_template": "{{ messages }}"}),
    (CHAT, {"echo": True}),
    (CHAT, {"best_of": 3}),
    (CMPL, {"best_of": 4, "n": 2}),  # the best 2 of 4: not what sampling 2 gives
    (RESP, {"previous_response_id": "resp_1"}),
    (RESP, {"tools": [{"type": "function", "name": "f"}]}),
    (RESP, {"background": True}),
    (RESP, {"top_logprobs": 2}),
]

NEUTRAL = [
    (CMPL, {"best_of": 1, "use_beam_search": False, "suffix": ""}),
    (CMPL, {"best_of": 3, "n": 3}),  # n samples, all returned: plain sampling
    (CHAT, {"best_of": 2, "n": 2}),
    (CMPL, {"best_of": None, "prompt_logprobs": None, "bad_words": [], "allowed_token_ids": None}),
    (CMPL, {"tools": [{"type": "function"}], "chat_template": "x"}),  # chat-only fields: not read here
    (CHAT, {"tools": [], "functions": None, "tool_choice": "auto", "function_call": "none", "echo": False}),
    (CHAT, {"tool_choice": "none", "user": "u", "store": True, "metadata": {"a": "b"}}),
    (CHAT, {"suffix": "x"}),  # a completion-only field: chat does not read it
    (RESP, {"store": True, "tools": [], "tool_choice": "auto", "background": False, "top_logprobs": 0}),
]


@pytest.mark.parametrize(("route", "body"), REFUSED)
def test_a_field_that_would_change_the_answer_is_a_400_naming_it(route: str, body: dict) -> None:
    with pytest.raises(APIError) as e:
        refuse_unsupported({"model": "m"} | body, route)
    name = next(iter(body))
    assert e.value.status == 400 and e.value.param == name and f"{name} is not supported" in e.value.message


@pytest.mark.parametrize(("route", "body"), NEUTRAL)
def test_values_that_change_nothing_pass(route: str, body: dict) -> None:
    refuse_unsupported(body, route)
