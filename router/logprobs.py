"""Worker logprob entries (`common.wire.logprobs.TokenLogprob`, one per generated token) -> OpenAI logprob
objects. Completions want parallel lists (tokens, token_logprobs,
top_logprobs as {token text: logprob}, text_offset); chat wants one object per token with its UTF-8
bytes and its alternatives.
"""

from __future__ import annotations

from collections.abc import Sequence

from common.wire.logprobs import TokenLogprob
from router.protocol import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob
from router.tokenizer import ModelTokenizer


def completion_logprobs(
    tokenizer: ModelTokenizer, token_ids: Sequence[int], entries: Sequence[TokenLogprob], text_offset: int
) -> CompletionLogprobs:
    """`text_offset` is where the first of these tokens starts in the choice's text."""
    out = CompletionLogprobs()
    for token_id, entry in zip(token_ids, entries, strict=False):
        text = tokenizer.token_text(token_id)
        out.tokens.append(text)
        out.token_logprobs.append(_finite(entry.logprob))
        out.top_logprobs.append({tokenizer.token_text(t): _finite(lp) for t, lp in entry.top})
        out.text_offset.append(text_offset)
        text_offset += len(text)
    return out


def chat_logprobs(
    tokenizer: ModelTokenizer, token_ids: Sequence[int], entries: Sequence[TokenLogprob]
) -> ChatLogprobs:
    content = []
    for token_id, entry in zip(token_ids, entries, strict=False):
        token = _top(tokenizer, token_id, entry.logprob)
        alternatives = [_top(tokenizer, t, lp) for t, lp in entry.top]
        content.append(ChatTokenLogprob(**token.model_dump(), top_logprobs=alternatives))
    return ChatLogprobs(content=content)


def _top(tokenizer: ModelTokenizer, token_id: int, logprob: float) -> TopLogprob:
    text = tokenizer.token_text(token_id)
    return TopLogprob(token=text, logprob=_finite(logprob), bytes=list(text.encode("utf-8")))


def _finite(value: float) -> float:
    """JSON has no -inf; OpenAI reports -9999.0 for impossible tokens."""
    return -9999.0 if value == float("-inf") else value
