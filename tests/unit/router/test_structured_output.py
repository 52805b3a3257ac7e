"""Structured output in the router: every way of asking (response_format json_object / json_schema,
vLLM's structured_outputs and guided_json / guided_regex / guided_choice / guided_grammar) on both
endpoints becomes the same validated grammar text in SamplingParams, and it reaches the prefill worker
on the wire. Bad inputs are in test_bad_inputs.py's table."""

from __future__ import annotations

import asyncio
import json

import llguidance
import pytest

from common.wire.messages import PrefillRequest
from common.wire.structured_output import GuidedRequest, json_schema_grammar, regex_grammar
from router.protocol import ChatCompletionRequest, CompletionRequest
from router.request_builder import RequestBuilder
from tests.helpers.structured_cases import CASES, PERSON
from tests.unit.router.fake_workers import Script
from tests.unit.router.harness import running_router

MSGS = [{"role": "user", "content": "hi"}]
# The README's example schema: it lists its properties and says nothing of additionalProperties.
OPEN_PERSON = {
    "type": "object",
    "required": ["name", "age"],
    "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"}},
}
EXACT = '{"name": "Mike", "age": 25}'
WITH_EXTRA = '{"name": "Mike", "age": 25, "city": "Paris"}'


@pytest.mark.parametrize("case", CASES, ids=[next(iter(c.request)) + str(i) for i, c in enumerate(CASES)])
def test_each_format_becomes_the_same_grammar_on_both_endpoints(tokenizer, case) -> None:
    builder = RequestBuilder(tokenizer)
    want = GuidedRequest(**case.request).grammar()
    assert want is not None
    completion = builder.completion(CompletionRequest(prompt="x", **case.request), 2048).sampling
    chat = builder.chat(ChatCompletionRequest(messages=MSGS, **case.request), 2048).sampling
    assert completion.grammar == chat.grammar == want


def test_the_spellings_of_one_schema_agree(tokenizer) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    grammars = {
        GuidedRequest(response_format=fmt).grammar(),
        GuidedRequest(guided_json=PERSON).grammar(),
        GuidedRequest(guided_json=json.dumps(PERSON)).grammar(),
        json_schema_grammar(PERSON),
    }
    assert len(grammars) == 1
    assert (
        GuidedRequest(structured_outputs={"json": PERSON, "disable_additional_properties": True}).grammar()
        in grammars
    )
    so_choice = GuidedRequest(structured_outputs={"choice": ["yes", "no"]}).grammar()
    assert so_choice == GuidedRequest(guided_choice=["yes", "no"]).grammar()
    so_object = GuidedRequest(structured_outputs={"json_object": True}).grammar()
    assert so_object == GuidedRequest(response_format={"type": "json_object"}).grammar()
    assert GuidedRequest(response_format={"type": "text"}).grammar() is None
    assert GuidedRequest().grammar() is None
    assert regex_grammar("a+") != regex_grammar("b+")


def test_the_grammar_reaches_the_prefill_worker(model_dir, tokenizer) -> None:
    reply = tokenizer.encode('{"name": "A", "age": 1}', add_special_tokens=False) + [2]
    specs = [("prefill-0", "prefill", Script(reply=reply)), ("decode-0", "decode", Script(reply=reply))]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}

    async def main():
        async with running_router(model_dir, tokenizer, specs) as h:
            body = {"messages": MSGS, "max_tokens": 32, "response_format": fmt}
            r = await h.client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            return h.worker("prefill-0").of_type(PrefillRequest)

    (sent,) = asyncio.run(main())
    assert sent.sampling.grammar == json_schema_grammar(PERSON)


@pytest.fixture(scope="module")
def ll_tokenizer(model_dir) -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer(str(model_dir / "tokenizer.json"))


def _accepts(grammar: str | None, text: str, ll_tokenizer: llguidance.LLTokenizer) -> bool:
    """Whether llguidance's matcher takes `text` (as the model's tokens) and may end there."""
    assert grammar is not None
    matcher = llguidance.LLMatcher(ll_tokenizer, grammar)
    tokens = ll_tokenizer.tokenize_str(text)
    return (
        matcher.validate_tokens(tokens) == len(tokens)
        and matcher.consume_tokens(tokens)
        and (matcher.is_accepting())
    )


def _schema_format(schema: dict, **extra) -> dict:
    return {
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema, **extra}}
    }


@pytest.mark.parametrize(
    "request_fields",
    [_schema_format(OPEN_PERSON), _schema_format(OPEN_PERSON, strict=True), {"guided_json": OPEN_PERSON}],
    ids=["response_format", "strict_true", "guided_json"],
)
def test_schemas_are_strict_by_default(request_fields, ll_tokenizer) -> None:
    grammar = GuidedRequest(**request_fields).grammar()
    assert _accepts(grammar, EXACT, ll_tokenizer)
    assert not _accepts(grammar, WITH_EXTRA, ll_tokenizer)


def test_strict_false_and_additional_properties_allow_extra_fields(ll_tokenizer) -> None:
    lenient = GuidedRequest(**_schema_format(OPEN_PERSON, strict=False)).grammar()
    allowing = GuidedRequest(guided_json=OPEN_PERSON | {"additionalProperties": True}).grammar()
    for grammar in (lenient, allowing):
        assert _accepts(grammar, EXACT, ll_tokenizer)
        assert _accepts(grammar, WITH_EXTRA, ll_tokenizer)


def test_nested_objects_are_closed_too(ll_tokenizer) -> None:
    schema = {"type": "object", "properties": {"who": OPEN_PERSON}, "required": ["who"]}
    grammar = GuidedRequest(guided_json=schema).grammar()
    assert _accepts(grammar, '{"who": ' + EXACT + "}", ll_tokenizer)
    assert not _accepts(grammar, '{"who": ' + WITH_EXTRA + "}", ll_tokenizer)
    assert not _accepts(grammar, '{"who": ' + EXACT + ', "x": 1}', ll_tokenizer)


def test_json_object_still_takes_any_object(ll_tokenizer) -> None:
    grammar = GuidedRequest(response_format={"type": "json_object"}).grammar()
    assert _accepts(grammar, WITH_EXTRA, ll_tokenizer)
