"""What steps really cost on this engine: the measured graph replays (`StepCosts`, from the runner)
corrected by the engine's own step times, which `StepTimer` takes from the steps as they run."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.runner.step_costs import StepCosts

if TYPE_CHECKING:
    from common.core.batch import ScheduledBatch

# Weight of the newest step in a size's moving average of observed step times.
_STEP_EMA = 0.2
# An observed step this many times slower than the current estimate is a one-off and is not learned,
# unless _OUTLIER_RUN of a size in a row are: then the estimate was wrong (a draft model whose own
# proposals cost several replays) and the size's estimate becomes the latest observation.
_OUTLIER_FACTOR = 3.0
_OUTLIER_RUN = 3
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
        self._outliers: dict[tuple[bool, int], int] = {}  # (verify, size) -> slow steps in a row
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
        wrong = False  # the estimate, not the step: slow every time
        if seconds > _OUTLIER_FACTOR * current:
            run = self._outliers.get((verify, size), 0) + 1
            self._outliers[verify, size] = run
            if run < _OUTLIER_RUN:
                return  # a one-off (a draft model's first prefill of a prompt, a collector pause)
            wrong = True
        self._outliers.pop((verify, size), None)
        weight = 1.0 if wrong or size not in table else _STEP_EMA
        table[size] = (1 - weight) * table.get(size, 0.0) + weight * seconds
        if verify:
            extra = max(0.0, seconds - self.costs.cost(rows) - _HOST_SECONDS_PER_ROW * rows)
            weight = 1.0 if wrong else _STEP_EMA
            self.host_per_step = (1 - weight) * self.host_per_step + weight * extra
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


# A decode-shaped step takes milliseconds; a longer gap between two steps is idle time, not step time.
_MAX_TIMED_STEP_SECONDS = 0.1


@dataclass(frozen=True)
class _TimedStep:
    verify: bool
    rows: int
    start: float  # perf_counter seconds
    drained_rows: int  # rows of the run-ahead step it drained first (0: none)


class StepTimer:
    """Feeds a `StepClock` the engine's step times: a step took from its start to the next one's.

    Only plain decode steps that ran ahead (or any, when no step does) and verification steps are
    timed: the two the clock compares. A step that first drained a run-ahead step waits there for
    that step's device work, so the drained step's own interval is cut short (not recorded) and one
    plain step of its size is taken off the draining step's (a verification launched behind a
    run-ahead step counts as draining it: it ends after that step's device work too)."""

    def __init__(self, run_ahead: bool) -> None:
        self.run_ahead = run_ahead  # the engine runs plain decode steps ahead
        self._timed: _TimedStep | None = None  # the last timed step, until the next one starts
        self._ahead_rows = 0  # rows of the last step if it ran ahead (a draining step waits for it)

    def step_started(
        self, clock: StepClock, start: float, batch: ScheduledBatch, ran_ahead: bool, drained: bool
    ) -> None:
        """A non-empty step began at `start`: time the previous one, remember this one."""
        last = self._timed
        if last is not None and not drained:
            seconds = start - last.start - (clock.plain_cost(last.drained_rows) if last.drained_rows else 0.0)
            if 0 < seconds < _MAX_TIMED_STEP_SECONDS:  # longer: the engine sat idle in between
                clock.observe(last.verify, last.rows, seconds)
        verify = batch.num_draft_tokens > 0
        timed = verify or (batch.is_decode and (ran_ahead or not self.run_ahead))
        drained_rows = self._ahead_rows if drained else 0
        self._timed = _TimedStep(verify, batch.num_decode_tokens, start, drained_rows) if timed else None
        self._ahead_rows = batch.num_decode_tokens if ran_ahead else 0
