"""Worker logprob entries (`common.wire.logprobs.TokenLogprob`, one per generated token) -> OpenAI logprob
objects. Completions want parallel lists (tokens, token_logprobs,
top_logprobs as {token text: logprob}, text_offset); chat wants one object per token with its UTF-8
bytes and its alternatives. With vLLM's `return_tokens_as_token_ids` (`as_ids`) every token is named
`token_id:N` instead of by its text (text that JSON cannot carry whole, e.g. half a UTF-8 character,
stays identifiable); the text offsets and the bytes stay those of the token's text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from common.wire.logprobs import TokenLogprob
from router.response_models import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob
from router.tokenizer import ModelTokenizer


class CompletionLogprobRun(NamedTuple):
    """Some tokens' completion logprobs, and where the text after them starts (the next run's offset)."""

    logprobs: CompletionLogprobs
    end_offset: int


def completion_logprobs(
    tokenizer: ModelTokenizer,
    token_ids: Sequence[int],
    entries: Sequence[TokenLogprob],
    text_offset: int,
    as_ids: bool = False,
) -> CompletionLogprobRun:
    """`text_offset` is where the first of these tokens starts in the choice's text."""
    out = CompletionLogprobs()
    name = token_id_name if as_ids else tokenizer.token_text
    for token_id, entry in zip(token_ids, entries, strict=False):
        text = tokenizer.token_text(token_id)
        out.tokens.append(token_id_name(token_id) if as_ids else text)
        out.token_logprobs.append(_finite(entry.logprob))
        out.top_logprobs.append({name(t): _finite(lp) for t, lp in entry.top})
        out.text_offset.append(text_offset)
        text_offset += len(text)
    return CompletionLogprobRun(out, text_offset)


def chat_logprobs(
    tokenizer: ModelTokenizer, token_ids: Sequence[int], entries: Sequence[TokenLogprob], as_ids: bool = False
) -> ChatLogprobs:
    content = []
    for token_id, entry in zip(token_ids, entries, strict=False):
        token = _top(tokenizer, token_id, entry.logprob, as_ids)
        alternatives = [_top(tokenizer, t, lp, as_ids) for t, lp in entry.top]
        content.append(ChatTokenLogprob(**token.model_dump(), top_logprobs=alternatives))
    return ChatLogprobs(content=content)


def token_id_name(token_id: int) -> str:
    """A token named by its id (vLLM's `return_tokens_as_token_ids` form)."""
    return f"token_id:{token_id}"


def _top(tokenizer: ModelTokenizer, token_id: int, logprob: float, as_ids: bool) -> TopLogprob:
    text = tokenizer.token_text(token_id)
    name = token_id_name(token_id) if as_ids else text
    return TopLogprob(token=name, logprob=_finite(logprob), bytes=list(text.encode("utf-8")))


def _finite(value: float) -> float:
    """JSON has no -inf; OpenAI reports -9999.0 for impossible tokens."""
    return -9999.0 if value == float("-inf") else value
