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
# Weight of the newest step in a size's moving average of observed step times.
_STEP_EMA = 0.2
# An observed step this many times slower than the current estimate is a one-off and is not learned.
_OUTLIER_FACTOR = 3.0
# Host seconds a synchronous verification adds per row before any was observed (then learned).
_PRIOR_HOST_SECONDS_PER_ROW = 15e-6


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

    def padded(self, rows: int) -> int:
        """The measured size a step of `rows` rows runs at."""
        return self.sizes[self._slot(rows)]

    def cost(self, rows: int) -> float:
        """Seconds for a step of `rows` rows (padded up to the next measured size)."""
        return self.seconds[self._slot(rows)]

    def _slot(self, rows: int) -> int:
        i = bisect.bisect_left(self.sizes, rows)
        if i == len(self.sizes):
            raise ValueError(f"rows ({rows}) exceed the largest measured size ({self.sizes[-1]})")
        return i


class StepClock:
    """What a step really costs on this engine, learned from its own steps.

    The graph replay times (`StepCosts`) are only the device's part. A plain decode step runs ahead,
    so its host work hides behind the device; a verification step is synchronous (its proposals read
    the tokens on the host), so the host's scheduling, proposing, sampling and acceptance add to it.
    The engine reports every plain run-ahead step and every verification step (wall seconds from one
    step's start to the next); each padded size keeps a moving average, and sizes not yet seen are
    estimated from the replay time plus the host time per row learned so far."""

    def __init__(self, costs: StepCosts) -> None:
        self.costs = costs
        self.plain: dict[int, float] = {}
        self.verify: dict[int, float] = {}
        self.host_per_row = _PRIOR_HOST_SECONDS_PER_ROW

    @property
    def max_rows(self) -> int:
        return self.costs.max_rows

    def observe(self, verify: bool, rows: int, seconds: float) -> None:
        if rows > self.costs.max_rows:
            return
        size = self.costs.padded(rows)
        table = self.verify if verify else self.plain
        current = self.verify_cost(rows) if verify else self.plain_cost(rows)
        if seconds > _OUTLIER_FACTOR * current:
            return  # a one-off (a draft model's first prefill of a prompt, a collector pause)
        table[size] = seconds if size not in table else (1 - _STEP_EMA) * table[size] + _STEP_EMA * seconds
        if verify:
            extra = max(0.0, seconds - self.costs.cost(rows)) / rows
            self.host_per_row = (1 - _STEP_EMA) * self.host_per_row + _STEP_EMA * extra

    def can_pay(self, num_rows: int) -> bool:
        """Could any verification beside a plain step of `num_rows` rows pay, even with every draft
        accepted (a step of s rows then yields s tokens)? A cheap bound checked before proposing."""
        plain_rate = num_rows / self.plain_cost(num_rows)
        return any(s / self.verify_cost(s) > plain_rate for s in self.costs.sizes if s > num_rows)

    def plain_cost(self, rows: int) -> float:
        return self.plain.get(self.costs.padded(rows), self.costs.cost(rows))

    def verify_cost(self, rows: int) -> float:
        estimate = self.costs.cost(rows) + self.host_per_row * rows
        return self.verify.get(self.costs.padded(rows), estimate)


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
    clock: StepClock, num_rows: int, wanted: list[tuple[Sequence, int]]
) -> list[tuple[Sequence, int]]:
    """The (sequence, draft count) pairs of `wanted` worth verifying in a step of `num_rows` plain rows:
    sequences join most-likely-accepted first while their rows fit the largest captured step, and the
    prefix with the most expected tokens per second wins if it beats the plain step (else none)."""
    ranked = sorted(wanted, key=lambda pair: acceptance_rate(pair[0]), reverse=True)
    best_rate, best_len = num_rows / clock.plain_cost(num_rows), 0
    rows, tokens = num_rows, float(num_rows)
    for i, (seq, drafts) in enumerate(ranked):
        rows += drafts
        if rows > clock.max_rows:
            break
        tokens += expected_tokens(seq, drafts) - 1.0
        rate = tokens / clock.verify_cost(rows)
        if rate > best_rate:
            best_rate, best_len = rate, i + 1
    return ranked[:best_len]
