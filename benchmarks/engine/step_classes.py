"""Which engine steps the long inter-token gaps come from (`pd_multiplex.py --step-classes`).

Every step of a run's window gets a class from what it did besides decoding: an aggregated engine's
step `decode` or `with prefill` (prompt tokens computed inside it); a multiplexed engine's `solo` (no
chunk in flight), `beside` (a chunk in flight before and after it), `launch` (it launched a chunk),
`resolve` (it took a finished chunk's tokens) or `resolve+launch`; `beside, 1st` is the step after a
launch (`common.multiplex.step_classes.StepClassifier`, which the worker's stats line uses too). The
step's wall time and the decode gaps it closed are kept per class,
so a tail (the gaps above an arm's p99) can be traced to the steps that make it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from common.core.percentile import percentile


@dataclass
class StepClasses:
    """Per class: each step's wall time and the decode gaps closed in it (seconds)."""

    step_seconds: dict[str, list[float]] = field(default_factory=dict)
    gaps: dict[str, list[float]] = field(default_factory=dict)

    def add_step(self, name: str, seconds: float) -> None:
        self.step_seconds.setdefault(name, []).append(seconds)

    def add_gap(self, name: str, gap: float) -> None:
        self.gaps.setdefault(name, []).append(gap)


def report_classes(arm: str, runs: list[StepClasses], tail_from: float) -> None:
    """One line per class of `arm`'s steps (all runs pooled): steps, their p50 / p99 wall time, and its
    share of the gaps at or above `tail_from` (the arm's ITL p99)."""
    names = sorted({n for r in runs for n in r.step_seconds})
    tail = sum(g >= tail_from for r in runs for gs in r.gaps.values() for g in gs)
    for name in names:
        seconds = [s for r in runs for s in r.step_seconds.get(name, ())]
        in_tail = sum(g >= tail_from for r in runs for g in r.gaps.get(name, ()))
        print(
            f"  {arm:<22} {name:<15} {len(seconds):>6} steps  p50 {1e3 * percentile(seconds, 50):7.2f}"
            f"  p99 {1e3 * percentile(seconds, 99):7.2f} ms   {in_tail:>5} of {tail} tail gaps"
        )
