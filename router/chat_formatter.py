"""The chat completion shape (POST /v1/chat/completions) of the OpenAI responses.

Kept apart from router/openai_responses.py, which holds what every shape shares (SSE lines, chunk
templates, usage, the stream loop): chat differs from a completion in its opening role chunks, its
deltas and its per-token logprobs, and the Responses API (router/responses_api.py) builds on it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from router.logprobs import chat_logprobs
from router.openai_responses import Formatter, blank_shape
from router.request_lifecycle import ChoiceUpdate
from router.response_models import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatLogprobs,
    DeltaMessage,
)
from router.token_stream import SequenceUpdate

_CHAT_CHOICE = blank_shape(ChatChunkChoice, index=0, delta=DeltaMessage())


class ChatFormatter(Formatter):
    _chunk_model = ChatCompletionChunk

    def _opening_chunks(self) -> list[dict]:
        """OpenAI streams the assistant role first, once per choice (the first with the prompt's
        token ids under return_token_ids)."""
        chunks = [
            self._envelope(
                [
                    {
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ]
            )
            for i in range(self.num_choices)
        ]
        if self.plan.return_token_ids:
            chunks[0]["prompt_token_ids"] = self.plan.prompts[0]
        return chunks

    def _logprobs(self, u: SequenceUpdate) -> ChatLogprobs | None:
        if u.logprobs is None:
            return None
        return chat_logprobs(self.tokenizer, u.token_ids, u.logprobs, self.plan.tokens_as_ids)

    def _chunk(self, choice_index: int, u: SequenceUpdate) -> dict:
        lp = self._logprobs(u)
        delta = _CHAT_CHOICE["delta"] | {"content": u.text or None}
        fields = {
            "index": choice_index,
            "delta": {k: v for k, v in delta.items() if v is not None},  # OpenAI omits them
            "logprobs": lp.model_dump() if lp else None,
            "finish_reason": u.finish_reason,
        }
        if self.plan.return_token_ids:
            fields["token_ids"] = u.token_ids
        return self._envelope([_CHAT_CHOICE | fields])

    async def collect(self, updates: AsyncIterator[ChoiceUpdate]) -> dict:
        logprobs: dict[int, ChatLogprobs] = {}
        async for item in updates:
            self.outputs[item.choice_index] = item.output
            lp = self._logprobs(item.update)
            if lp is not None:
                logprobs.setdefault(item.choice_index, ChatLogprobs()).content.extend(lp.content)
        choices = [
            ChatChoice(
                index=i,
                message=AssistantMessage(content=o.text),
                logprobs=logprobs.get(i),
                finish_reason=o.finish_reason,
            )
            for i, o in sorted(self.outputs.items())
        ]
        body = self._response_body(ChatCompletionResponse, choices)
        if self.plan.return_token_ids:
            body["prompt_token_ids"] = self.plan.prompts[0]  # a chat request has one prompt
        return body
