"""The request models' own checks, where they stand in for pydantic's (router/protocol.py)."""

from __future__ import annotations

import pytest
from pydantic import ConfigDict, TypeAdapter, ValidationError

from router.protocol import ChatCompletionRequest, CompletionRequest

PROMPT_UNION = TypeAdapter(str | list[str] | list[int] | list[list[int]], config=ConfigDict(strict=True))
PROMPTS = [
    "text",
    "",
    ["a", "b"],
    [1, 2, 3],
    list(range(2048)),
    [[1, 2], [3]],
    [],
    [[]],
    [[1], []],
    ["a", 1],
    [1, "a"],
    [1, True],
    [True],
    [[1, True]],
    [1.0, 2],
    [[1], 2],
    [[1], ["a"]],
    None,
    5,
    {"a": 1},
    [None],
]


def _union_accepts(prompt) -> bool:
    try:
        PROMPT_UNION.validate_python(prompt)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("prompt", PROMPTS, ids=repr)
def test_the_prompt_shape_check_accepts_what_the_strict_union_does(prompt) -> None:
    """`_prompt_shape` replaces the union's validation (which errs on every item of a long id list
    for each string member): it must accept the same values, keep them as they are, and refuse the
    empty forms the union alone would let through."""
    empty = prompt in ([], [[]]) or (isinstance(prompt, list) and [] in prompt)
    try:
        request = CompletionRequest.model_validate({"prompt": prompt})
    except ValidationError as e:
        assert not _union_accepts(prompt) or empty
        assert e.errors()[0]["loc"] == ("prompt",)
        return
    assert _union_accepts(prompt) and not empty
    assert request.prompt == prompt and type(request.prompt) is type(prompt)


def test_only_an_assistant_message_may_come_without_content() -> None:
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant"}, {"role": "assistant", "content": None}]
    request = ChatCompletionRequest.model_validate({"messages": turns})
    assert [m.text() for m in request.messages] == ["hi", "", ""]
    for role in ("system", "developer", "user", "tool"):
        with pytest.raises(ValueError, match=f"content is required for a {role} message"):
            ChatCompletionRequest.model_validate({"messages": [{"role": role}]})
