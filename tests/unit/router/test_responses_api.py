"""OpenAI's Responses API (POST /v1/responses) through the router against scripted workers: the request
reaches the prefill worker as the chat request it means, the answer parses as the openai client's own
Response and event models (the reference for their shape), streamed or not, and what has no meaning here
is a 400 naming the field."""

from __future__ import annotations

import asyncio
import json

import pytest

from common.wire.messages import PrefillRequest
from router.tokenizer import ModelTokenizer
from tests.unit.router.fake_workers import Script
from tests.unit.router.harness import running_router

openai_types = pytest.importorskip("openai.types.responses")

REPLY_TEXT = " Paris, of course."
EOS = 2
ROUTE = "/v1/responses"


def _specs(tokenizer: ModelTokenizer) -> list:
    reply = tokenizer.encode(REPLY_TEXT, add_special_tokens=False) + [EOS]
    return [("prefill-0", "prefill", Script(reply=reply)), ("decode-0", "decode", Script(reply=reply))]


def _run(model_dir, tokenizer, check) -> None:
    async def main():
        async with running_router(model_dir, tokenizer, _specs(tokenizer)) as h:
            await check(h)

    asyncio.run(main())


def _events(text: str) -> list[dict]:
    """The JSON of each event (its `event:` line checked against its type), [DONE] last."""
    events = []
    for block in text.strip().split("\n\n"):
        lines = block.split("\n")
        if lines == ["data: [DONE]"]:
            events.append("[DONE]")
            continue
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        payload = json.loads(lines[1][len("data: ") :])
        assert payload["type"] == lines[0][len("event: ") :]
        events.append(payload)
    return events


def test_a_response_is_the_chat_answer_in_the_responses_shape(model_dir, tokenizer) -> None:
    body = {"input": "The capital of France?", "instructions": "Be brief.", "max_output_tokens": 64}

    async def check(h):
        r = await h.client.post(ROUTE, json=body)
        assert r.status_code == 200, r.text
        response = openai_types.Response.model_validate(r.json())
        assert response.id.startswith("resp") and response.status == "completed"
        assert response.output_text == REPLY_TEXT
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": body["input"]}]
        sent = h.worker("prefill-0").of_type(PrefillRequest)[0]
        assert sent.prompt_token_ids == tokenizer.encode_chat(messages)
        assert sent.sampling.max_tokens == 64
        assert response.usage.input_tokens == len(sent.prompt_token_ids)
        assert response.usage.output_tokens == len(tokenizer.encode(REPLY_TEXT, add_special_tokens=False)) + 1
        short = await h.client.post(
            ROUTE, json={"input": [{"role": "user", "content": "x"}], "max_output_tokens": 2}
        )
        cut = openai_types.Response.model_validate(short.json())
        assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"

    _run(model_dir, tokenizer, check)


def test_the_stream_is_openais_event_sequence(model_dir, tokenizer) -> None:
    parts = [{"type": "input_text", "text": "The capital"}, {"type": "input_text", "text": "of France?"}]
    body = {"input": [{"type": "message", "role": "user", "content": parts}], "stream": True}

    async def check(h):
        r = await h.client.post(ROUTE, json=body)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = _events(r.text)
        assert events[-1] == "[DONE]"
        events = events[:-1]
        kinds = [e["type"] for e in events]
        assert kinds[:4] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
        ]
        assert kinds[-4:] == [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
        assert set(kinds[4:-4]) == {"response.output_text.delta"}
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        deltas = [openai_types.ResponseTextDeltaEvent.model_validate(e).delta for e in events[4:-4]]
        assert "".join(deltas) == REPLY_TEXT == events[-4]["text"]
        done = openai_types.ResponseCompletedEvent.model_validate(events[-1]).response
        assert done.output_text == REPLY_TEXT and done.status == "completed"
        sent = h.worker("prefill-0").of_type(PrefillRequest)[0]
        assert sent.prompt_token_ids == tokenizer.encode_chat(
            [{"role": "user", "content": "The capital\nof France?"}]
        )
        # Cut short, it still ends with response.completed (the client's stream helpers wait for it).
        cut = _events((await h.client.post(ROUTE, json=body | {"max_output_tokens": 2})).text)[-2]
        assert cut["type"] == "response.completed" and cut["response"]["status"] == "incomplete"

    _run(model_dir, tokenizer, check)


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"tools": [{"type": "function", "name": "f"}]}, "tools"),
        ({"background": True}, "background"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input"),
        ({"input": []}, "input"),
        ({"input": 5}, "input"),
        ({"text": {"format": {"type": "xml"}}}, "response_format"),
    ],
)
def test_what_has_no_meaning_here_is_a_400_naming_the_field(model_dir, tokenizer, fields, param) -> None:
    async def check(h):
        r = await h.client.post(ROUTE, json={"input": "x"} | fields)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param
        assert (await h.client.post(ROUTE, json={"input": "x"})).status_code == 200  # still serving

    _run(model_dir, tokenizer, check)


def test_a_stored_response_is_not_found_by_its_id(model_dir, tokenizer) -> None:
    async def check(h):
        for method in ("get", "delete"):
            r = await getattr(h.client, method)(f"{ROUTE}/resp_abc")
            error = r.json()["error"]
            assert r.status_code == 404 and error["code"] == "not_found" and "resp_abc" in error["message"]

    _run(model_dir, tokenizer, check)
