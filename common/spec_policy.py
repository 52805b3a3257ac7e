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
a sequence's acceptance record lives on the sequence and changes only in `record_acceptance`.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from common.sequence import Sequence

# Acceptance counts decay by this factor per verification, so the draft length follows the text the
# sequence is writing now (copying, then free prose, then copying again).
_DECAY = 0.7


@dataclass(frozen=True)
class StepCosts:
    """Measured seconds of one step by padded row count (`sizes` ascending, `seconds` alike)."""

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.sizes or len(self.sizes) != len(self.seconds):
            raise ValueError("step costs need one time per size")
        if list(self.sizes) != sorted(self.sizes):
            raise ValueError("step cost sizes must be ascending")

    @property
    def max_rows(self) -> int:
        return self.sizes[-1]

    def cost(self, rows: int) -> float:
        """Seconds for a step of `rows` rows (padded up to the next measured size)."""
        i = bisect.bisect_left(self.sizes, rows)
        if i == len(self.sizes):
            raise ValueError(f"rows ({rows}) exceed the largest measured size ({self.sizes[-1]})")
        return self.seconds[i]


def acceptance_rate(seq: Sequence) -> float:
    """Estimated chance that the sequence's next draft token is accepted (Laplace-smoothed, decayed)."""
    return (seq.spec_accepted + 1.0) / (seq.spec_accepted + seq.spec_rejected + 2.0)


def record_acceptance(seq: Sequence, proposed: int, accepted: int) -> None:
    """Fold one verification into the sequence's record: `accepted` hits and, unless every draft was
    accepted, one miss (the first rejected draft ends the run; later drafts say nothing)."""
    seq.spec_accepted = _DECAY * seq.spec_accepted + accepted
    seq.spec_rejected = _DECAY * seq.spec_rejected + (1.0 if accepted < proposed else 0.0)


def draft_length(seq: Sequence, max_tokens: int) -> int:
    """Drafts worth proposing: about the expected accepted run plus one, at least 1, at most max_tokens
    (all of them before the first verification: a sequence starts optimistic)."""
    if seq.spec_accepted == 0.0 and seq.spec_rejected == 0.0:
        return max_tokens
    a = acceptance_rate(seq)
    expected_run = a / (1.0 - a)
    return max(1, min(max_tokens, int(expected_run + 1.5)))


def expected_tokens(seq: Sequence, drafts: int) -> float:
    """Expected tokens a verification of `drafts` drafts yields: accepted drafts + the sampled one."""
    a = acceptance_rate(seq)
    return 1.0 + sum(a**j for j in range(1, drafts + 1))


def choose_drafts(
    costs: StepCosts, num_rows: int, wanted: list[tuple[Sequence, int]]
) -> list[tuple[Sequence, int]]:
    """The (sequence, draft count) pairs of `wanted` worth verifying in a step of `num_rows` plain rows:
    sequences join most-likely-accepted first while their rows fit the largest captured step, and the
    prefix with the most expected tokens per second wins if it beats the plain step (else none)."""
    ranked = sorted(wanted, key=lambda pair: acceptance_rate(pair[0]), reverse=True)
    best_rate, best_len = num_rows / costs.cost(num_rows), 0
    rows, tokens = num_rows, float(num_rows)
    for i, (seq, drafts) in enumerate(ranked):
        rows += drafts
        if rows > costs.max_rows:
            break
        tokens += expected_tokens(seq, drafts) - 1.0
        rate = tokens / costs.cost(rows)
        if rate > best_rate:
            best_rate, best_len = rate, i + 1
    return ranked[:best_len]


def worth_speculating(costs: StepCosts, num_rows: int, drafts: list[tuple[Sequence, int]]) -> bool:
    """Does a step of `num_rows` plain rows plus `drafts` ((sequence, draft count) pairs) yield more
    expected tokens per second than the plain step alone?"""
    extra = sum(d for _, d in drafts)
    if not extra or num_rows + extra > costs.max_rows:
        return False
    gain = sum(expected_tokens(seq, d) - 1.0 for seq, d in drafts)
    return (num_rows + gain) / costs.cost(num_rows + extra) > num_rows / costs.cost(num_rows)
