"""Structured output in the router: every way of asking (response_format json_object / json_schema,
vLLM's guided_json / guided_regex / guided_choice / guided_grammar) on both endpoints becomes the same
validated grammar text in SamplingParams, and it reaches the prefill worker on the wire. Bad inputs
are in test_bad_inputs.py's table."""

from __future__ import annotations

import asyncio
import json

import pytest

from common.wire.messages import PrefillRequest
from common.wire.structured_output import GuidedRequest, json_schema_grammar, regex_grammar
from router.protocol import ChatCompletionRequest, CompletionRequest
from router.request_builder import RequestBuilder
from tests.helpers.structured_cases import CASES, PERSON
from tests.unit.router.fake_workers import Script
from tests.unit.router.harness import running_router

MSGS = [{"role": "user", "content": "hi"}]


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
