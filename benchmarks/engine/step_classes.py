"""Which engine steps the long inter-token gaps come from (`pd_multiplex.py --step-classes`).

Every step of a run's window gets a class from what it did besides decoding: an aggregated engine's
step `decode` or `with prefill` (prompt tokens computed inside it); a multiplexed engine's `solo` (no
chunk in flight), `beside` (a chunk in flight before and after it), `launch` (it launched a chunk),
`resolve` (it took a finished chunk's tokens) or `resolve+launch`; `beside, 1st` is the step after a
launch (see `StepClassifier`). The step's wall time and the decode gaps it closed are kept per class,
so a tail (the gaps above an arm's p99) can be traced to the steps that make it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class StepClassifier:
    """Classes one engine's steps; `before` is called before each step, `after` once it returned.

    With decode steps run ahead, a step mostly waits for the decode step launched by the step before
    it, so the first step after a `launch` is classed apart (`beside, 1st`): its wait is the first
    decode step beside the new chunk, where a chunk's start would show."""

    def __init__(self, engine) -> None:
        self._mux = engine.multiplexer  # None: an aggregated engine
        self._in_flight = False
        self._launched = 0
        self._after_launch = False

    def before(self) -> None:
        if self._mux is not None:
            self._in_flight = self._mux.chunk_in_flight
            self._launched = sum(self._mux.stats.chunks_per_lane.values())

    def after(self, num_prefill_tokens: int) -> str:
        if self._mux is None:
            return "with prefill" if num_prefill_tokens else "decode"
        launched = sum(self._mux.stats.chunks_per_lane.values()) > self._launched
        resolved = self._in_flight and (launched or not self._mux.chunk_in_flight)
        after_launch, self._after_launch = self._after_launch, launched
        if launched:
            return "resolve+launch" if resolved else "launch"
        if resolved:
            return "resolve"
        if not self._in_flight:
            return "solo"
        return "beside, 1st" if after_launch else "beside"


@dataclass
class StepClasses:
    """Per class: each step's wall time and the decode gaps closed in it (seconds)."""

    step_seconds: dict[str, list[float]] = field(default_factory=dict)
    gaps: dict[str, list[float]] = field(default_factory=dict)

    def add_step(self, name: str, seconds: float) -> None:
        self.step_seconds.setdefault(name, []).append(seconds)

    def add_gap(self, name: str, gap: float) -> None:
        self.gaps.setdefault(name, []).append(gap)


def report_classes(arm: str, runs: list[StepClasses], tail_from: float, pct) -> None:
    """One line per class of `arm`'s steps (all runs pooled): steps, their p50 / p99 wall time, and its
    share of the gaps at or above `tail_from` (the arm's ITL p99)."""
    names = sorted({n for r in runs for n in r.step_seconds})
    tail = sum(g >= tail_from for r in runs for gs in r.gaps.values() for g in gs)
    for name in names:
        seconds = [s for r in runs for s in r.step_seconds.get(name, ())]
        in_tail = sum(g >= tail_from for r in runs for g in r.gaps.get(name, ()))
        print(
            f"  {arm:<22} {name:<15} {len(seconds):>6} steps  p50 {1e3 * pct(seconds, 0.5):7.2f}"
            f"  p99 {1e3 * pct(seconds, 0.99):7.2f} ms   {in_tail:>5} of {tail} tail gaps"
        )
