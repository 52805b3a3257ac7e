"""When and how far to speculate: per-sequence draft lengths from acceptance, a batch decision from
measured step costs.

A verification step computes 1 + d rows for a sequence with d drafts. Whether that pays depends on
two measured things: how many drafts the sequence's recent proposals had accepted, and what a step
of that many rows costs on this device compared with a plain decode step. On a GPU with CUDA graphs
a small decode step is launch-bound (a step of 8 rows costs barely more than a step of 1), so
speculation is nearly free at small batches; at large batches the step is compute-bound and extra
rows cost their full share, so speculation stops paying. `StepCosts` holds that curve (timed graph
replays at start-up); without it (the CPU) the fixed `max_batch` rule of `SpeculativeConfig` applies.

Invariants: the policy only ever shortens or drops proposals (exactness is `accept_drafts`' job), and
a sequence's acceptance record (`Acceptance`) lives in the speculator's table, keyed by sequence id,
and changes only through its `record` and `wait`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from common.spec_decode.step_clock import StepClock

K = TypeVar("K")  # what a caller names each proposal by (a sequence)

# Acceptance counts decay by this factor per verification, so the draft length follows the text the
# sequence is writing now (copying, then free prose, then copying again).
_DECAY = 0.7
# A sequence's record fades by this factor per token it gains without a verification, so one that
# stopped speculating after misses tries again later (the text it writes may have turned to copying):
# after 10 such tokens its record weighs a third.
_IDLE_DECAY = 0.9


@dataclass
class Acceptance:
    """One sequence's speculation record: decayed counts of its accepted and rejected drafts, and when
    it may propose again. The speculator keeps one per speculating sequence, keyed by sequence id;
    only `record` and `wait` write it. `length` arguments are the sequence's completion length now
    (every decode step adds a token, so lengths also count steps)."""

    accepted: float = 0.0
    rejected: float = 0.0
    verified_at: int = 0  # completion length the counts date from (the last verification)
    resume_at: int = 0  # completion length before which the sequence does not propose

    def rate(self, length: int) -> float:
        """Estimated chance that the sequence's next draft token is accepted (Laplace-smoothed,
        decayed per verification and faded by the tokens gained since the last one)."""
        fade = self._idle_fade(length)
        accepted, rejected = fade * self.accepted, fade * self.rejected
        return (accepted + 1.0) / (accepted + rejected + 2.0)

    def record(self, length: int, proposed: int, accepted: int) -> None:
        """Fold one verification in: `accepted` hits and, unless every draft was accepted, one miss
        (the first rejected draft ends the run; later drafts say nothing). `length` counts the
        verification's tokens (the accepted drafts and the sampled one)."""
        fade = _DECAY * self._idle_fade(length - (accepted + 1))
        self.accepted = fade * self.accepted + accepted
        self.rejected = fade * self.rejected + (1.0 if accepted < proposed else 0.0)
        self.verified_at = length

    def draft_length(self, length: int, max_tokens: int) -> int:
        """Drafts worth proposing: about the expected accepted run plus one, at least 1, at most
        max_tokens (all of them before the first verification: a sequence starts optimistic)."""
        if self.accepted == 0.0 and self.rejected == 0.0:
            return max_tokens
        a = self.rate(length)
        expected_run = a / (1.0 - a)
        return max(1, min(max_tokens, int(expected_run + 1.5)))

    def is_waiting(self, length: int) -> bool:
        """The sequence waits before proposing again (after a rejection, or finding nothing to
        propose). A wait is kept as the length at which it ends: every decode step adds a token, so it
        counts itself down, and no step has to visit the sequences that wait."""
        return length < self.resume_at

    def wait(self, length: int, steps: int) -> None:
        """Skip the next `steps` steps that would let the sequence propose."""
        self.resume_at = length + steps

    def _idle_fade(self, length: int) -> float:
        """How much of the record is left at `length`: it fades per token gained since the
        verification it dates from."""
        idle = length - self.verified_at
        return _IDLE_DECAY**idle if idle > 0 else 1.0


# Read where a sequence has no record yet (never written: `Acceptance` writers take their own).
FRESH = Acceptance()


def draft_gains(rate: float, drafts: int) -> list[float]:
    """Expected tokens each of a proposal's drafts adds at acceptance rate `rate`: the j-th counts
    only if the j - 1 before it were accepted too (rate^j for j = 1..drafts), so the gains fall along
    the proposal."""
    gain, gains = 1.0, []
    for _ in range(drafts):
        gain *= rate
        gains.append(gain)
    return gains


def choose_drafts(clock: StepClock, num_rows: int, wanted: list[tuple[K, float, int]]) -> list[tuple[K, int]]:
    """The (key, draft count) pairs worth verifying in a step of `num_rows` plain rows, from `wanted`'s
    (key, acceptance rate, draft count) entries: each count at most the wanted one, in `wanted`'s
    order; [] when none pays.

    Drafts join one at a time by their gain (`draft_gains`; a sequence's drafts therefore join in
    order, and each count is a prefix of its proposal) while the rows fit the largest captured step;
    the prefix with the most expected tokens per second wins if it beats the plain step."""
    # Ties keep `wanted`'s order, and within a proposal gains fall: its drafts join in order.
    gains = sorted((-g, i) for i, (_, rate, drafts) in enumerate(wanted) for g in draft_gains(rate, drafts))
    best = _best_prefix(clock, num_rows, [-g for g, _ in gains])
    counts = [0] * len(wanted)
    for _, i in gains[:best]:
        counts[i] += 1
    return [(key, c) for (key, _, _), c in zip(wanted, counts, strict=True) if c]


def any_pays(clock: StepClock, num_rows: int, wanted: list[tuple[K, float, int]]) -> bool:
    """Would `choose_drafts` choose anything? (Stops at the first draft prefix that pays.)"""
    gains = sorted((g for _, rate, drafts in wanted for g in draft_gains(rate, drafts)), reverse=True)
    return _best_prefix(clock, num_rows, gains, first=True) > 0


def _best_prefix(clock: StepClock, num_rows: int, gains: list[float], first: bool = False) -> int:
    """How many of `gains` (descending) to verify beside `num_rows` plain rows for the most expected
    tokens per second, 0 when no prefix beats the plain step; `first`: any prefix that beats it."""
    gains = gains[: max(0, clock.max_rows - num_rows)]
    if not gains:
        return 0
    costs = clock.verify_costs(num_rows + 1, num_rows + 1 + len(gains))
    best_rate, best_len = num_rows / clock.plain_cost(num_rows), 0
    tokens = float(num_rows)
    for n, (gain, cost) in enumerate(zip(gains, costs, strict=True), start=1):
        tokens += gain
        if tokens > best_rate * cost:
            best_rate, best_len = tokens / cost, n
            if first:
                break
    return best_len
