"""How many prompt tokens a multiplexed decode step may carry inline: a measured break-even (pure Python).

A short waiting prompt can reach the device two ways in multiplexed mode, and each costs the decoding
streams one longer gap:
* inline, as mixed rows of the next decode step: the step takes longer by the prompt's device time,
  about `tokens x seconds_per_token` (every stream waits for it);
* as a chunk on the prefill share: the one engine thread spends the chunk's host time (scheduling,
  launching, resolving its first tokens) instead of launching decode steps (a host-bound model loses
  about a decode step per chunk).

So a step inlines prompt tokens while their device time stays under one chunk's host time:
`budget = host_seconds / seconds_per_token`. Both are measured on the chunks themselves, as they
run, so the rule follows the model and the device with no table: a 135M model (host-bound, ~1 ms per
launch, well under a microsecond per prompt token) inlines thousands of tokens a step, an 8B shape
(tens of microseconds per token) next to none. Until a chunk has been measured the budget is 0: every
prompt runs as a chunk, which is what measures it.

A chunk's seconds per token are its wall time from launch to the step that found it done, over its
tokens; on an SM share and read at step granularity that is an upper bound of the device time, so the
rule errs towards chunks (the side that leaves decode steps short).
"""

from __future__ import annotations

from dataclasses import dataclass

# Weight of the newest chunk in the running averages: a few chunks settle a changed load.
SMOOTHING = 0.25


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
    """Prompt tokens the next decode step may carry inline (`tokens`), from measured chunks
    (`observe`). Invariant: 0 until the first chunk is observed; never above `cap`."""

    def __init__(self, cap: int) -> None:
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
            raise ValueError(f"cap must be an int >= 0, got {cap!r}")
        self.cap = cap
        self._host_seconds: float | None = None
        self._seconds_per_token: float | None = None

    def observe(self, chunk: ChunkTiming) -> None:
        per_token = chunk.wall_seconds / chunk.tokens
        self._host_seconds = _smooth(self._host_seconds, chunk.host_seconds)
        self._seconds_per_token = _smooth(self._seconds_per_token, per_token)

    @property
    def tokens(self) -> int:
        if self._host_seconds is None or not self._seconds_per_token:
            return 0
        return min(self.cap, int(self._host_seconds / self._seconds_per_token))


def _smooth(old: float | None, new: float) -> float:
    return new if old is None else old + SMOOTHING * (new - old)
