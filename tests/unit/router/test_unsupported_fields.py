"""Fields that would change the answer are refused unless set to the value that changes nothing."""

from __future__ import annotations

import pytest

from router.errors import APIError
from router.unsupported_fields import refuse_unsupported

REFUSED = [
    (False, {"best_of": 2}),
    (False, {"best_of": True}),
    (False, {"use_beam_search": True}),
    (False, {"prompt_logprobs": 0}),
    (False, {"allowed_token_ids": [1, 2]}),
    (False, {"bad_words": ["x"]}),
    (False, {"echo": True}),
    (False, {"suffix": "x"}),
    (True, {"tools": [{"type": "function"}]}),
    (True, {"functions": [{"name": "f"}]}),
    (True, {"tool_choice": "required"}),
    (True, {"tool_choice": {"type": "function", "function": {"name": "f"}}}),
    (True, {"function_call": {"name": "f"}}),
    (True, {"chat_template": "{{ messages }}"}),
    (True, {"echo": True}),
    (True, {"best_of": 3}),
]

NEUTRAL = [
    (False, {"best_of": 1, "use_beam_search": False, "suffix": ""}),
    (False, {"best_of": None, "prompt_logprobs": None, "bad_words": [], "allowed_token_ids": None}),
    (False, {"tools": [{"type": "function"}], "chat_template": "x"}),  # chat-only fields: not read here
    (True, {"tools": [], "functions": None, "tool_choice": "auto", "function_call": "none", "echo": False}),
    (True, {"tool_choice": "none", "user": "u", "store": True, "metadata": {"a": "b"}}),
    (True, {"suffix": "x"}),  # a completion-only field: chat does not read it
]


@pytest.mark.parametrize(("chat", "body"), REFUSED)
def test_a_field_that_would_change_the_answer_is_a_400_naming_it(chat: bool, body: dict) -> None:
    with pytest.raises(APIError) as e:
        refuse_unsupported({"model": "m"} | body, chat)
    (name,) = body
    assert e.value.status == 400 and e.value.param == name and f"{name} is not supported" in e.value.message


@pytest.mark.parametrize(("chat", "body"), NEUTRAL)
def test_values_that_change_nothing_pass(chat: bool, body: dict) -> None:
    refuse_unsupported(body, chat)
