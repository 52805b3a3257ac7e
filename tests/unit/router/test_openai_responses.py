"""SSE formatting of merged updates: the per-choice text template agrees with the model-built chunks,
and an update that carries nothing sends nothing."""

from __future__ import annotations

import asyncio
import json

import pytest

from common.wire.detokenizer import IncrementalDetokenizer
from common.wire.messages import FinishReason
from common.wire.sampling_params import SamplingParams
from router.chat_formatter import ChatFormatter
from router.fanout import ChoiceUpdate
from router.openai_responses import DONE, CompletionFormatter
from router.protocol import ChatCompletionRequest, StreamOptions
from router.request_builder import GenerationPlan, RequestBuilder
from router.response_models import (
    ChatChunkChoice,
    ChatCompletionChunk,
    CompletionChoice,
    CompletionChunk,
    DeltaMessage,
    PromptTokensDetails,
    Usage,
)
from router.token_stream import SequenceOutput, SequenceUpdate

# Quotes, a backslash, a newline, non-ASCII and a control character: everything JSON must escape.
AWKWARD_TEXT = 'a "quoted" \\ line\nhé 日本 \x01'


def _stream_lines(
    formatter_cls, tokenizer, updates: list[tuple[int, SequenceUpdate]], n: int = 1
) -> list[str]:
    """Every SSE line the formatter streams for (choice index, update) pairs of one prompt (the
    formatter hands several lines over as one piece where they are sent together)."""
    sampling = SamplingParams(max_tokens=8, n=n)
    plan = GenerationPlan([[1, 2, 3]], sampling, stream=True, include_usage=False, skip_special_tokens=True)
    formatter = formatter_cls("req-1", "model", 1700000000, plan, tokenizer)
    output = SequenceOutput(IncrementalDetokenizer(tokenizer.backend), sampling)

    async def items():
        for i, u in updates:
            yield ChoiceUpdate(i, u, output)

    async def collect() -> list[str]:
        return [line async for line in formatter.stream(items())]

    text = "".join(asyncio.run(collect()))
    return [event + "\n\n" for event in text.split("\n\n") if event]


def _payload(line: str) -> dict:
    assert line.startswith("data: ") and line.endswith("\n\n")
    return json.loads(line[len("data: ") :])


@pytest.mark.parametrize(
    ("formatter_cls", "text_of"),
    [
        (ChatFormatter, lambda choice: choice["delta"]["content"]),
        (CompletionFormatter, lambda choice: choice["text"]),
    ],
)
def test_text_template_matches_model_built_chunk(tokenizer, formatter_cls, text_of):
    updates = [
        (0, SequenceUpdate(AWKWARD_TEXT, [5], None)),  # text only: the template path
        (0, SequenceUpdate("", [], None)),  # nothing new: no chunk at all
        (0, SequenceUpdate(AWKWARD_TEXT, [6], None, FinishReason.STOP)),  # built from the models
    ]
    lines = _stream_lines(formatter_cls, tokenizer, updates)
    opening = 1 if formatter_cls is ChatFormatter else 0  # chat streams the assistant role first
    assert len(lines) == opening + 3 and lines[-1] == DONE
    templated, built = _payload(lines[opening]), _payload(lines[opening + 1])
    assert text_of(templated["choices"][0]) == AWKWARD_TEXT
    assert built["choices"][0]["finish_reason"] == "stop"
    built["choices"][0]["finish_reason"] = None
    assert templated == built  # same envelope, same choice: only the finish differed


def test_template_is_per_choice(tokenizer):
    updates = [(i, SequenceUpdate(text, [5], None)) for i, text in ((0, "zero"), (1, "one"), (0, "again"))]
    lines = _stream_lines(ChatFormatter, tokenizer, updates, n=2)[2:-1]  # past both openings, before [DONE]
    seen = [(c["index"], c["delta"]["content"]) for c in (_payload(x)["choices"][0] for x in lines)]
    assert seen == [(0, "zero"), (1, "one"), (0, "again")]


def test_chunks_and_usage_have_the_models_shapes(tokenizer):
    """The stream builds chunks from templates of the response models (no model object per request):
    they must be what the models themselves give, finish, empty delta and usage included."""
    sampling = SamplingParams(max_tokens=8)
    plan = GenerationPlan([[1, 2, 3]], sampling, stream=True, include_usage=True, skip_special_tokens=True)
    updates = [SequenceUpdate("hi", [5], None), SequenceUpdate("", [6], None, FinishReason.LENGTH)]
    for formatter_cls in (CompletionFormatter, ChatFormatter):
        formatter = formatter_cls("req-1", "model", 1700000000, plan, tokenizer)
        output = SequenceOutput(IncrementalDetokenizer(tokenizer.backend), sampling)
        output.token_ids = [5, 6]

        async def items(output=output):
            for u in updates:
                yield ChoiceUpdate(0, u, output)

        async def lines(formatter=formatter, items=items) -> str:
            return "".join([line async for line in formatter.stream(items())])

        payloads = [
            json.loads(e[len("data: ") :])
            for e in asyncio.run(lines()).split("\n\n")
            if e.startswith("data: {")
        ]
        chat = formatter_cls is ChatFormatter
        chunk_model = ChatCompletionChunk if chat else CompletionChunk
        expected = [
            _model_chunk(chunk_model, chat, "hi", None),
            _model_chunk(chunk_model, chat, "", "length"),
            chunk_model(id="req-1", created=1700000000, model="model", choices=[], usage=_usage()).model_dump(
                mode="json"
            ),
        ]
        assert payloads[-3:] == expected, formatter_cls


def _usage() -> Usage:
    return Usage(
        prompt_tokens=3, completion_tokens=2, total_tokens=5, prompt_tokens_details=PromptTokensDetails()
    )


def _model_chunk(chunk_model, chat: bool, text: str, finish: str | None) -> dict:
    if chat:
        choice = ChatChunkChoice(index=0, delta=DeltaMessage(content=text or None), finish_reason=finish)
        dumped = choice.model_dump(mode="json")
        dumped["delta"] = {k: v for k, v in dumped["delta"].items() if v is not None}
    else:
        dumped = CompletionChoice(index=0, text=text, finish_reason=finish).model_dump(mode="json")
    return chunk_model(id="req-1", created=1700000000, model="model", choices=[]).model_dump(mode="json") | {
        "choices": [dumped]
    }


def test_continuous_usage_puts_the_usage_so_far_in_every_chunk(tokenizer):
    """vLLM's stream_options.continuous_usage_stats (with include_usage): every chunk, the chat role
    chunk included, carries the usage at that point; the usage chunk still ends the stream."""
    stream_options = {"include_usage": True, "continuous_usage_stats": True}
    req = ChatCompletionRequest(
        messages=[{"role": "user", "content": "hi"}], stream=True, stream_options=stream_options
    )
    plan = RequestBuilder(tokenizer).chat(req, 256)
    assert plan.continuous_usage
    formatter = ChatFormatter("req-1", "model", 1700000000, plan, tokenizer)
    output = SequenceOutput(IncrementalDetokenizer(tokenizer.backend), plan.sampling)
    updates = [
        SequenceUpdate("a", [5], None),
        SequenceUpdate("b", [6], None),
        SequenceUpdate("", [7], None, FinishReason.STOP),
    ]

    async def items():
        for u in updates:
            output.token_ids += u.token_ids
            yield ChoiceUpdate(0, u, output)

    async def collect() -> str:
        return "".join([line async for line in formatter.stream(items())])

    payloads = [
        json.loads(e[len("data: ") :])
        for e in asyncio.run(collect()).split("\n\n")
        if e.startswith("data: {")
    ]
    prompt = len(plan.prompts[0])
    assert [p["usage"]["completion_tokens"] for p in payloads] == [0, 1, 2, 3, 3]
    assert all(p["usage"]["prompt_tokens"] == prompt for p in payloads)
    assert [p["choices"] == [] for p in payloads] == [False] * 4 + [True]  # then the usage chunk
    plain = RequestBuilder(tokenizer).chat(
        req.model_copy(update={"stream_options": StreamOptions(continuous_usage_stats=True)}), 256
    )
    assert not plain.continuous_usage  # without include_usage there is no usage at all
