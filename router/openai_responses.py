"""Shape merged sequence updates into OpenAI responses: SSE chunks or one full response.

Choice index = prompt_index * n + sample_index (OpenAI's order for several prompts with n > 1).
usage.prompt_tokens counts each prompt once; completion_tokens counts every choice's tokens;
prompt_tokens_details.cached_tokens is what the prefill workers reported for each prompt's first sample.
With vLLM's `return_token_ids` a choice also carries its output's token ids (`token_ids`: in a stream,
each chunk's own) and the prompt's (`prompt_token_ids`: on each completion choice, once per streamed
choice; on the chat response, or its first chunk). The chat shape is router/chat_formatter.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from pydantic import BaseModel

from router.logprobs import completion_logprobs
from router.request_builder import GenerationPlan
from router.request_lifecycle import ChoiceUpdate
from router.response_models import (
    ChatCompletionChunk,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    CompletionResponse,
    PromptTokensDetails,
    Usage,
)
from router.token_stream import SequenceOutput, SequenceUpdate, StreamInterval
from router.tokenizer import ModelTokenizer

DONE = "data: [DONE]\n\n"
_MARK = "\u2063pdserve-text\u2063"  # stands for the text while a chunk template is built


# Encoders built once: json.dumps with arguments builds a new one per call (per token, for the text).
_encode_payload = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_encode_text = json.JSONEncoder(ensure_ascii=False).encode


def sse(payload: dict) -> str:
    return f"data: {_encode_payload(payload)}\n\n"


def blank_shape(shape: type[BaseModel], **required: Any) -> dict:
    """A model's JSON shape with its defaults (placeholders for the required fields), dumped once: the
    stream path fills copies of these, so a chunk's schema stays the models' (router/protocol.py) while
    no model object is built per request."""
    return shape(**required).model_dump()


_HEADS = {
    chunk: blank_shape(chunk, id="", created=0, model="", choices=[])
    for chunk in (CompletionChunk, ChatCompletionChunk)
}
_COMPLETION_CHOICE = blank_shape(CompletionChoice, index=0, text="")
_USAGE = blank_shape(Usage, prompt_tokens_details=PromptTokensDetails())


class Formatter:
    _chunk_model: type[CompletionChunk | ChatCompletionChunk]  # each subclass's chunk

    def __init__(
        self,
        request_id: str,
        model: str,
        created: int,
        plan: GenerationPlan,
        tok: ModelTokenizer,
        stream_interval: int = 1,
    ) -> None:
        self.request_id = request_id
        self.model = model
        self.created = created
        self.plan = plan
        self.tokenizer = tok
        self.outputs: dict[int, SequenceOutput] = {}
        self._templates: dict[int, tuple[str, str]] = {}
        self._head: dict | None = None  # the chunk fields every chunk shares, built once
        self._interval = StreamInterval(stream_interval)
        # A text-only update goes out from its choice's template unless every chunk carries more.
        self._plain_text = not (plan.continuous_usage or plan.return_token_ids)
        self._prompt_ids_sent: set[int] = set()  # streamed choices whose prompt ids went out

    @property
    def num_choices(self) -> int:
        return len(self.plan.prompts) * self.plan.sampling.n

    def usage(self) -> dict:
        """The usage object's JSON (the `Usage` model's shape)."""
        n = self.plan.sampling.n
        prompt_tokens = sum(len(p) for p in self.plan.prompts)
        completion = sum(o.num_generated for o in self.outputs.values())
        cached = sum(o.cached_tokens for i, o in self.outputs.items() if i % n == 0)
        return _USAGE | {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
            "prompt_tokens_details": _USAGE["prompt_tokens_details"] | {"cached_tokens": cached},
        }

    async def stream(self, updates: AsyncIterator[ChoiceUpdate]) -> AsyncGenerator[str]:
        """The SSE text, in pieces that are each sent as one write: the opening chunks (chat's role)
        go out with the first text, and the chunk that finishes the last choice together with the
        usage chunk and [DONE], which always end the stream. The first piece is thus the first text:
        nothing is written before it (router/generation_routes.py sends the headers with it)."""
        opening = "".join(sse(self._counted(payload)) for payload in self._opening_chunks())
        last, finished, num_choices = "", 0, self.num_choices
        interval = self._interval if self._interval.k > 1 else None  # None: every update goes out
        async for item in updates:  # once per SSE chunk: the loop's lookups are hoisted
            self.outputs[item.choice_index] = item.output
            u = item.update if interval is None else interval.push(item.choice_index, item.update)
            if u is None:
                continue
            line = self._line(item.choice_index, u)
            finished += u.finish_reason is not None
            if finished == num_choices:
                last = line  # nothing follows but the trailer
            elif line:
                if opening:
                    line, opening = opening + line, ""
                yield line
        usage = sse(self._envelope([], usage=self.usage())) if self.plan.include_usage else ""
        yield opening + last + usage + DONE

    async def collect(self, updates: AsyncIterator[ChoiceUpdate]) -> dict:
        """The whole response's JSON, once every choice has finished."""
        raise NotImplementedError

    def _line(self, choice_index: int, u: SequenceUpdate) -> str:
        if not (
            u.text
            or u.finish_reason is not None
            or u.logprobs
            or (u.token_ids and self.plan.return_token_ids)
        ):
            return ""  # an empty update sends nothing (with return_token_ids, a token without text is news)
        if u.finish_reason is None and u.logprobs is None and self._plain_text:
            return self._text_line(choice_index, u.text)  # the common chunk, from its template
        return sse(self._counted(self._chunk(choice_index, u)))

    def _counted(self, payload: dict) -> dict:
        """`payload` with the usage so far, when the request asked for it in every chunk."""
        return payload | {"usage": self.usage()} if self.plan.continuous_usage else payload

    def _text_line(self, choice_index: int, text: str) -> str:
        """The SSE line of a chunk carrying only text: the one per-token chunk, so it is built from a
        per-choice template (made once by the same code as every other chunk) around the JSON text."""
        template = self._templates.get(choice_index)
        if template is None:
            head, tail = sse(self._chunk(choice_index, SequenceUpdate(_MARK, [], None))).split(f'"{_MARK}"')
            template = self._templates[choice_index] = (head, tail)
        return template[0] + _encode_text(text) + template[1]

    def _opening_chunks(self) -> list[dict]:
        return []

    def _chunk(self, choice_index: int, u: SequenceUpdate) -> dict:
        """The chunk payload for one choice's update (which carries text, logprobs or a finish)."""
        raise NotImplementedError

    def _prompt_of(self, choice_index: int) -> list[int]:
        """The prompt token ids a choice was sampled from (choice index = prompt index * n + sample)."""
        return self.plan.prompts[choice_index // self.plan.sampling.n]

    def _prompt_ids_once(self, choice_index: int) -> list[int] | None:
        """The choice's prompt token ids the first time they are asked for (return_token_ids), else None."""
        if choice_index in self._prompt_ids_sent:
            return None
        self._prompt_ids_sent.add(choice_index)
        return self._prompt_of(choice_index)

    def _response_body(self, shape: type[CompletionResponse | ChatCompletionResponse], choices: list) -> dict:
        """The whole response's JSON; with return_token_ids each choice carries its output's ids."""
        response = shape(
            id=self.request_id,
            created=self.created,
            model=self.model,
            choices=choices,
            usage=Usage.model_validate(self.usage()),
        )
        body = response.model_dump()
        if self.plan.return_token_ids:
            for choice in body["choices"]:
                choice["token_ids"] = self.outputs[choice["index"]].token_ids
        return body

    def _envelope(self, choices: list, usage: dict | None = None) -> dict:
        if self._head is None:
            self._head = _HEADS[self._chunk_model] | {
                "id": self.request_id,
                "created": self.created,
                "model": self.model,
            }
        return self._head | {"choices": choices, "usage": usage}


class CompletionFormatter(Formatter):
    _chunk_model = CompletionChunk

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._text_offsets: dict[int, int] = {}

    def _logprobs(self, choice_index: int, u: SequenceUpdate) -> CompletionLogprobs | None:
        if u.logprobs is None:
            return None
        start = self._text_offsets.get(choice_index, 0)
        run = completion_logprobs(self.tokenizer, u.token_ids, u.logprobs, start, self.plan.tokens_as_ids)
        self._text_offsets[choice_index] = run.end_offset
        return run.logprobs

    def _chunk(self, choice_index: int, u: SequenceUpdate) -> dict:
        lp = self._logprobs(choice_index, u)
        fields = {"index": choice_index, "text": u.text, "finish_reason": u.finish_reason}
        if self.plan.return_token_ids:
            fields["token_ids"] = u.token_ids
            if (prompt := self._prompt_ids_once(choice_index)) is not None:
                fields["prompt_token_ids"] = prompt
        return self._envelope([_COMPLETION_CHOICE | fields | {"logprobs": lp.model_dump() if lp else None}])

    async def collect(self, updates: AsyncIterator[ChoiceUpdate]) -> dict:
        logprobs: dict[int, CompletionLogprobs] = {}
        async for item in updates:
            self.outputs[item.choice_index] = item.output
            lp = self._logprobs(item.choice_index, item.update)
            if lp is not None:
                merged = logprobs.setdefault(item.choice_index, CompletionLogprobs())
                for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                    getattr(merged, name).extend(getattr(lp, name))
        choices = [
            CompletionChoice(index=i, text=o.text, logprobs=logprobs.get(i), finish_reason=o.finish_reason)
            for i, o in sorted(self.outputs.items())
        ]
        body = self._response_body(CompletionResponse, choices)
        if self.plan.return_token_ids:
            for choice in body["choices"]:
                choice["prompt_token_ids"] = self._prompt_of(choice["index"])
        return body
