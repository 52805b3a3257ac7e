"""Which prompts a multiplexed decode step may carry inline: a measured break-even (pure Python).

A short waiting prompt can reach the device two ways in multiplexed mode, and each costs the decoding
streams one longer gap:
* inline, as mixed rows of the next decode step: the step takes longer by the prompt's device time,
  about `tokens x seconds_per_token` (every stream waits for it);
* as a chunk on the prefill share: the one engine thread spends the chunk's host time (scheduling,
  launching, resolving its first tokens) instead of launching decode steps (a host-bound model loses
  about a decode step per chunk).

So a prompt is inlined while its device time stays under one short chunk's host time:
`budget = host_seconds / seconds_per_token` tokens. (A step packs such prompts as many as fit its token
budget, as aggregated mode and the fixed limit do: a step capped at the budget in all, tried first,
served the default model at 0.86x aggregated against 1.02x packed; docs/benchmarks.md.)
Both are measured on the chunks themselves, as they run, so the rule follows the model and the device
with no table: a 135M model (host-bound, ~1 ms per chunk, well under a microsecond per prompt token)
inlines its short prompts, an 8B shape (tens of microseconds per token) next to none. Until a chunk
has been measured the budget is 0: every prompt runs as a chunk, which is what measures it.

What is measured where: a chunk's seconds per token are its wall time from scheduling to the step
that found it done, averaged weighted by tokens, so the long chunks, whose step-sized reading error
is small against their length, dominate (on an SM share that is still an upper bound of the device
time: the rule errs towards chunks, the side that keeps decode steps short). The host time is the
cost a short prompt's own chunk would have: it is averaged over chunks of at most `cap` tokens only
(a long chunk may launch eager, for far more host time than the chunks that inlining replaces), and
until such a chunk has been seen the budget stays 0.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

# Weight of the newest chunk in the running averages: a few chunks settle a changed load.
SMOOTHING = 0.25
# The cap when none is configured: the fixed rule's measured length (--mux-inline-prompt-tokens 512).
DEFAULT_CAP = 512


@dataclass(frozen=True)
class ChunkTiming:
    """One chunk as it ran: its prompt `tokens`, the engine thread's seconds on it (scheduling,
    launching every part, resolving), and the seconds from scheduling to found done."""

    tokens: int
    host_seconds: float
    wall_seconds: float

    def __post_init__(self) -> None:
        if isinstance(self.tokens, bool) or not isinstance(self.tokens, int) or self.tokens < 1:
            raise ValueError(f"tokens must be a positive int, got {self.tokens!r}")
        if not self.host_seconds >= 0:
            raise ValueError(f"host_seconds must be >= 0, got {self.host_seconds!r}")
        if not self.wall_seconds > 0:
            raise ValueError(f"wall_seconds must be positive, got {self.wall_seconds!r}")


class InlineBudget:
    """The longest uncached prompt the next decode step may take inline (`tokens`; the step packs such
    prompts up to its token budget, as the fixed limit does), from measured chunks (`observe`).
    Invariant: 0 until a chunk of at most `cap` tokens is observed; never above `cap`."""

    def __init__(self, cap: int) -> None:
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
            raise ValueError(f"cap must be an int >= 0, got {cap!r}")
        self.cap = cap
        self.tokens = 0  # read every decode step, so computed once per chunk observed
        self._host_seconds: float | None = None  # of a short chunk
        self._wall_seconds: float | None = None  # wall seconds and tokens of a chunk, their ratio the
        self._tokens: float | None = None  # token-weighted seconds per token

    def observe(self, chunk: ChunkTiming) -> None:
        """One finished chunk's timing; a budget that moves by 2x (or to or from 0) is logged."""
        before = self.tokens
        self._wall_seconds = _smooth(self._wall_seconds, chunk.wall_seconds)
        self._tokens = _smooth(self._tokens, chunk.tokens)
        if chunk.tokens <= self.cap:
            self._host_seconds = _smooth(self._host_seconds, chunk.host_seconds)
        if self._host_seconds is not None:
            self.tokens = min(self.cap, int(self._host_seconds * self._tokens / self._wall_seconds))
        after = self.tokens
        if (before == 0) != (after == 0) or not before / 2 <= after <= 2 * before:
            log.info(
                "inline budget %d -> %d tokens, the longest prompt inlined"
                " (chunk of %d: host %.2f ms, %.2f ms to done)",
                before,
                after,
                chunk.tokens,
                1e3 * chunk.host_seconds,
                1e3 * chunk.wall_seconds,
            )


def _smooth(old: float | None, new: float) -> float:
    return new if old is None else old + SMOOTHING * (new - old)
