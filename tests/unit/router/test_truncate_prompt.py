"""vLLM's truncate_prompt_tokens: a prompt keeps its last k tokens (-1: the context window's worth),
on both endpoints; the request is then planned as if it had sent those tokens."""

from __future__ import annotations

import pytest

from router.errors import APIError
from router.protocol import ChatCompletionRequest, CompletionRequest
from router.request_builder import RequestBuilder

WINDOW = 64
MSGS = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Count: one two three"}]


def test_a_prompt_keeps_its_last_tokens(tokenizer) -> None:
    builder = RequestBuilder(tokenizer)
    ids = list(range(1000, 1010))
    plan = builder.completion(CompletionRequest(prompt=ids, truncate_prompt_tokens=4), WINDOW)
    assert plan.prompts == [ids[-4:]]
    text = "The quick brown fox jumps over the lazy dog"
    plan = builder.completion(CompletionRequest(prompt=[text, "Hi"], truncate_prompt_tokens=3), WINDOW)
    assert plan.prompts == [tokenizer.encode(text)[-3:], tokenizer.encode("Hi")[-3:]]
    chat = builder.chat(ChatCompletionRequest(messages=MSGS, truncate_prompt_tokens=5, max_tokens=4), WINDOW)
    assert chat.prompts == [tokenizer.encode_chat(MSGS)[-5:]]


def test_long_text_is_tokenized_and_truncated_and_minus_one_is_the_window(tokenizer) -> None:
    builder = RequestBuilder(tokenizer)
    long_text = "word " * (WINDOW * tokenizer.max_token_chars)  # refused untruncated, before tokenizing
    with pytest.raises(APIError) as e:
        builder.completion(CompletionRequest(prompt=long_text, max_tokens=1), WINDOW)
    assert "characters" in e.value.message
    plan = builder.completion(CompletionRequest(prompt=long_text, truncate_prompt_tokens=8), WINDOW)
    assert plan.prompts == [tokenizer.encode(long_text)[-8:]]
    short = builder.completion(CompletionRequest(prompt="Hello there", truncate_prompt_tokens=-1), WINDOW)
    assert short.prompts == [tokenizer.encode("Hello there")]
    with pytest.raises(APIError) as e:  # as vLLM: the window's worth of prompt leaves no room to generate
        builder.completion(CompletionRequest(prompt=long_text, truncate_prompt_tokens=-1), WINDOW)
    assert e.value.code == "context_length_exceeded" and "the prompt has 64" in e.value.message


@pytest.mark.parametrize("bad", [0, -2])
def test_other_values_are_400s(tokenizer, bad: int) -> None:
    with pytest.raises(APIError) as e:
        RequestBuilder(tokenizer).completion(
            CompletionRequest(prompt="x", truncate_prompt_tokens=bad), WINDOW
        )
    assert e.value.status == 400 and e.value.param == "truncate_prompt_tokens"
