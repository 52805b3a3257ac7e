"""What one forward pass hands back to the scheduler (torch-free, so the scheduler stays so too)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RunnerOutput:
    """One entry per sequence of the batch, in batch order.

    `sampled[i]`: the tokens sampled for sequence i: none for a mid-prompt chunk, one per verified
    position (accepted drafts' checks plus the bonus) for a sequence that verified drafts, else one.
    `logprobs[i]`: the last sampled token's logprobs, when the request asked for them.
    """

    sampled: list[list[int]]
    logprobs: list[dict | None]
