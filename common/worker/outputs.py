"""Engine state in the form a TokenOutput carries."""

from __future__ import annotations

from common.core.sequence import Sequence
from common.wire.logprobs import TokenLogprob


def wire_logprobs(seq: Sequence, num_tokens: int) -> list[TokenLogprob] | None:
    """The logprobs of `seq`'s last `num_tokens` tokens, or None when the request did not ask for them."""
    if seq.sampling_params.logprobs is None or num_tokens == 0:
        return None
    entries = seq.logprobs[-num_tokens:]
    if len(entries) != num_tokens:  # should not happen; better no logprobs than a malformed message
        return None
    return entries


def prefill_timings(seq: Sequence, now: float) -> dict[str, float]:
    """Stage seconds of a prompt computed here, at its first token: waiting, then computing it."""
    started = seq.first_scheduled_at if seq.first_scheduled_at is not None else now
    return {"prefill_queue": max(started - seq.created_at, 0.0), "prefill": max(now - started, 0.0)}
