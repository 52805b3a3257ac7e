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

from common.core.sequence import Sequence
from common.runner.step_costs import StepCosts

# Acceptance counts decay by this factor per verification, so the draft length follows the text the
# sequence is writing now (copying, then free prose, then copying again).
_DECAY = 0.7
# A sequence's record fades by this factor per token it gains without a verification, so one that
# stopped speculating after misses tries again later (the text it writes may have turned to copying):
# after 10 such tokens its record weighs a third.
_IDLE_DECAY = 0.9
# Weight of the newest step in a size's moving average of observed step times.
_STEP_EMA = 0.2
# An observed step this many times slower than the current estimate is a one-off and is not learned.
_OUTLIER_FACTOR = 3.0
# The host's share of a synchronous verification step beyond its replay, modelled as a per-step part
# (schedule, propose, launch, read back: learned, this is its prior) plus a per-row part (sampling
# rows and accepting drafts: fixed). Learning only a per-row rate blew up the estimate of long
# verifications from short ones (H200 at 7561408: 282 us "per row" from 2-4-row steps, so longer
# ones were never tried); learning only a per-step cost priced 200-row verifications of a 64-row
# batch at their replay and they were tried at a loss (b63e584: batch 64 at 0.66-0.94x).
_PRIOR_HOST_SECONDS_PER_STEP = 200e-6
_HOST_SECONDS_PER_ROW = 15e-6


class StepClock:
    """What a step really costs on this engine, learned from its own steps.

    The graph replay times (`StepCosts`) are only the device's part. A plain decode step runs ahead,
    so its host work hides behind the device; a verification step is synchronous (its proposals read
    the tokens on the host), so the host's scheduling, proposing, sampling and acceptance add to it.
    The engine reports every plain run-ahead step and every verification step (wall seconds from one
    step's start to the next); each padded size keeps a moving average, and sizes not yet seen are
    estimated from the replay time plus the host's share: the per-step part learned so far and a
    fixed per-row part."""

    def __init__(self, costs: StepCosts) -> None:
        self.costs = costs
        self.plain: dict[int, float] = {}
        self.verify: dict[int, float] = {}
        self.host_per_step = _PRIOR_HOST_SECONDS_PER_STEP
        self._verifications = 0  # verification steps observed (what `_best_rates` was computed at)
        self._rates_key: tuple[int, float] | None = None
        self._best_rates: list[float] = []

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
            extra = max(0.0, seconds - self.costs.cost(rows) - _HOST_SECONDS_PER_ROW * rows)
            self.host_per_step = (1 - _STEP_EMA) * self.host_per_step + _STEP_EMA * extra
            self._verifications += 1

    def can_pay(self, num_rows: int) -> bool:
        """Could any verification beside a plain step of `num_rows` rows pay, even with every draft
        accepted (a step of s rows then yields s tokens)? A bound checked every step before anything
        else: O(1) while no verification is observed (the large batches where none pays)."""
        i = bisect.bisect_right(self.costs.sizes, num_rows)
        rates = self._rates()
        return i < len(rates) and rates[i] > num_rows / self.plain_cost(num_rows)

    def _rates(self) -> list[float]:
        """[i]: the best tokens per second of a fully accepted verification of sizes[i] rows or more.
        Depends only on verification costs, so it is recomputed after a verification is observed."""
        key = (self._verifications, self.host_per_step)
        if key != self._rates_key:
            rates = [s / self.verify_cost(s) for s in self.costs.sizes]
            for i in range(len(rates) - 2, -1, -1):
                rates[i] = max(rates[i], rates[i + 1])
            self._rates_key, self._best_rates = key, rates
        return self._best_rates

    def plain_cost(self, rows: int) -> float:
        return self.plain.get(self.costs.padded(rows), self.costs.cost(rows))

    def verify_costs(self, first: int, stop: int) -> list[float]:
        """`verify_cost(rows)` for rows in range(first, stop), in one walk over the sizes."""
        sizes, seconds, learned = self.costs.sizes, self.costs.seconds, self.verify
        i, out = self.costs.slot(first), []
        for rows in range(first, stop):
            if sizes[i] < rows:  # rows grow by one, sizes strictly: at most one size further
                i += 1
            cost = learned.get(sizes[i])
            out.append(seconds[i] + self._host(rows) if cost is None else cost)
        return out

    def _host(self, rows: int) -> float:
        return self.host_per_step + _HOST_SECONDS_PER_ROW * rows

    def verify_cost(self, rows: int) -> float:
        estimate = self.costs.cost(rows) + self._host(rows)
        return self.verify.get(self.costs.padded(rows), estimate)


def _idle_fade(seq: Sequence, length: int) -> float:
    """How much of the record is left at completion length `length`: it fades per token gained since
    the verification it dates from."""
    idle = length - seq.spec_verified_at
    return _IDLE_DECAY**idle if idle > 0 else 1.0


def acceptance_rate(seq: Sequence) -> float:
    """Estimated chance that the sequence's next draft token is accepted (Laplace-smoothed, decayed
    per verification and faded by the tokens gained since the last one)."""
    fade = _idle_fade(seq, seq.num_completion_tokens)
    accepted, rejected = fade * seq.spec_accepted, fade * seq.spec_rejected
    return (accepted + 1.0) / (accepted + rejected + 2.0)


def record_acceptance(seq: Sequence, proposed: int, accepted: int) -> None:
    """Fold one verification into the sequence's record: `accepted` hits and, unless every draft was
    accepted, one miss (the first rejected draft ends the run; later drafts say nothing). Call it once
    the verification's tokens (the accepted drafts and the sampled one) are appended."""
    fade = _DECAY * _idle_fade(seq, seq.num_completion_tokens - (accepted + 1))
    seq.spec_accepted = fade * seq.spec_accepted + accepted
    seq.spec_rejected = fade * seq.spec_rejected + (1.0 if accepted < proposed else 0.0)
    seq.spec_verified_at = seq.num_completion_tokens


def draft_length(seq: Sequence, max_tokens: int) -> int:
    """Drafts worth proposing: about the expected accepted run plus one, at least 1, at most max_tokens
    (all of them before the first verification: a sequence starts optimistic)."""
    if seq.spec_accepted == 0.0 and seq.spec_rejected == 0.0:
        return max_tokens
    a = acceptance_rate(seq)
    expected_run = a / (1.0 - a)
    return max(1, min(max_tokens, int(expected_run + 1.5)))


def draft_gains(seq: Sequence, drafts: int) -> list[float]:
    """Expected tokens each of a proposal's drafts adds: the j-th counts only if the j - 1 before it
    were accepted too (a^j for j = 1..drafts), so the gains fall along the proposal."""
    a, gain, gains = acceptance_rate(seq), 1.0, []
    for _ in range(drafts):
        gain *= a
        gains.append(gain)
    return gains


def choose_drafts(
    clock: StepClock, num_rows: int, wanted: list[tuple[Sequence, int]]
) -> list[tuple[Sequence, int]]:
    """The (sequence, draft count) pairs worth verifying in a step of `num_rows` plain rows, each count
    at most the wanted one (in `wanted`'s order; [] when none pays).

    Drafts join one at a time by their gain (`draft_gains`; a sequence's drafts therefore join in
    order, and each count is a prefix of its proposal) while the rows fit the largest captured step;
    the prefix with the most expected tokens per second wins if it beats the plain step."""
    # Ties keep `wanted`'s order, and within a proposal gains fall: its drafts join in order.
    gains = sorted((-g, i) for i, (seq, drafts) in enumerate(wanted) for g in draft_gains(seq, drafts))
    best = _best_prefix(clock, num_rows, [-g for g, _ in gains])
    counts = [0] * len(wanted)
    for _, i in gains[:best]:
        counts[i] += 1
    return [(seq, c) for (seq, _), c in zip(wanted, counts, strict=True) if c]


def any_pays(clock: StepClock, num_rows: int, wanted: list[tuple[Sequence, int]]) -> bool:
    """Would `choose_drafts` choose anything? (Stops at the first draft prefix that pays.)"""
    gains = sorted((g for seq, drafts in wanted for g in draft_gains(seq, drafts)), reverse=True)
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
