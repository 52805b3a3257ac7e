"""The one shape of a token's log-probabilities, from the sampler through the wire to the router.

Torch-free: the sampler builds these from the raw model logits, the offline `LLM` returns them, a
worker's `TokenOutput` carries them (as {"logprob": float, "top": [[token_id, logprob], ...]}, see
`common.wire.messages`) and the router turns them into OpenAI logprob objects.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TokenLogprob:
    """The chosen token's log-probability and the `k` most likely tokens as (token_id, logprob), best
    first (`k` = SamplingParams.logprobs; empty for 0). Impossible tokens carry -inf."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()
