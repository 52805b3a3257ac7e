"""Each engine step's class, by what it did besides decoding, so that long inter-token gaps can be
traced to the steps that make them: in the engine benchmark (`pd_multiplex.py --step-classes`) and,
served, in the worker's stats line (common/worker/stats_log.py), where every stream's gap is about the
wall time of the step that produced its token.

An aggregated engine's steps are `decode` or `with prefill` (prompt tokens computed inside the step);
a multiplexed engine's are `solo` (no chunk in flight), `beside` (a chunk in flight before and after
it), `launch` (it launched a chunk), `resolve` (it took a finished chunk's tokens), `resolve+launch`,
or `beside, 1st`: the first step after a launch. With decode steps run ahead a step mostly waits for
the decode step launched by the step before it, so that first step's wait is the first decode step
beside the new chunk, where a chunk's start would show.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from common.multiplex.stepper import MultiplexedSteps


class StepClassifier:
    """Classes one engine's steps; `before` is called before each step, `after` once it returned.
    `multiplexer`: the engine's (None: an aggregated engine)."""

    def __init__(self, multiplexer: MultiplexedSteps | None) -> None:
        self._mux = multiplexer
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
