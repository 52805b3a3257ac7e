"""When a sampled token ends a sequence: a stop token id or EOS (once `min_tokens` are generated),
`max_tokens`, or the model's context length. Stop strings are text: the detokenizing layer applies
them (`common.wire.detokenizer`)."""

from __future__ import annotations

from collections.abc import Collection
from typing import NamedTuple

from common.core.sequence import FinishReason, Sequence


def stop_reason(
    seq: Sequence, token: int, length: int, eos_token_ids: Collection[int], max_model_len: int
) -> FinishReason | None:
    """Why `token`, ending the first `length` tokens of `seq`, finishes it (None: it goes on)."""
    params = seq.sampling_params
    completion = length - seq.num_prompt_tokens
    if token in params.stop_token_ids and completion >= params.min_tokens:
        return FinishReason.STOP
    eos = not params.ignore_eos and token in eos_token_ids
    if eos and completion >= params.min_tokens:
        return FinishReason.STOP
    if length_exhausted(seq, length, max_model_len):
        return FinishReason.LENGTH
    return None


class Stop(NamedTuple):
    index: int  # of the token in the run that finishes the sequence
    reason: FinishReason


def first_stop(
    seq: Sequence, tokens: list[int], length: int, eos_token_ids: Collection[int], max_model_len: int
) -> Stop | None:
    """The first of `tokens`, appended after the first `length` tokens of `seq`, that finishes it, or
    None. Checks the run as a whole first: a length limit is reached by the run's end or not at all,
    and a run without stop or EOS ids needs no token-by-token look."""
    params = seq.sampling_params
    if not length_exhausted(seq, length + len(tokens), max_model_len):
        stops, eos = params.stop_token_ids, () if params.ignore_eos else eos_token_ids
        if len(tokens) == 1:  # a plain decode step's one token: no generator
            if tokens[0] not in stops and tokens[0] not in eos:
                return None
        elif not any(t in stops or t in eos for t in tokens):
            return None
    for i, token in enumerate(tokens):
        reason = stop_reason(seq, token, length + i + 1, eos_token_ids, max_model_len)
        if reason is not None:
            return Stop(i, reason)
    return None


def length_exhausted(seq: Sequence, length: int, max_model_len: int) -> bool:
    """The first `length` tokens of `seq` use up its max_tokens or the model's context."""
    completion = length - seq.num_prompt_tokens
    return completion >= seq.sampling_params.max_tokens or length >= max_model_len


def finishes_in_flight(seq: Sequence, max_model_len: int) -> bool:
    """A run-ahead placeholder (a token still on the device) is `seq`'s last token by length, so the
    sequence needs no further step: the step's resolve finishes it."""
    length = len(seq) - seq.num_draft_tokens  # drafts proposed behind it are not tokens yet
    return seq.num_pending_tokens > 0 and length_exhausted(seq, length, max_model_len)
