"""Small conversions from engine state to wire fields."""

from __future__ import annotations

from common.sampling_params import SamplingParams
from common.sequence import Sequence


def sampling_from_wire(sampling: dict) -> SamplingParams:
    """SamplingParams from a message's `sampling` dict; any problem is a ValueError naming the field."""
    try:
        return SamplingParams.from_dict(sampling)
    except TypeError as e:  # an unknown or missing key
        raise ValueError(f"sampling: {e}") from None


def wire_logprobs(seq: Sequence, num_tokens: int) -> list[dict] | None:
    """The last `num_tokens` logprob entries of `seq` in the wire form, or None when not asked for.

    The sampler records {"token_logprob", "top": [(id, logprob), ...]}; TokenOutput wants
    {"logprob": float, "top": [[id, logprob], ...]}.
    """
    if seq.sampling_params.logprobs is None or num_tokens == 0:
        return None
    entries = seq.logprobs[-num_tokens:]
    if len(entries) != num_tokens:  # should not happen; better no logprobs than a malformed message
        return None
    return [
        {"logprob": float(e["token_logprob"]), "top": [[int(t), float(lp)] for t, lp in e["top"]]}
        for e in entries
    ]


def finish_reason(seq: Sequence) -> str | None:
    return seq.finish_reason.value if seq.finish_reason is not None else None
