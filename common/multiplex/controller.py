"""Which SM share the next prefill chunk gets: a load-following split (pure Python, no torch).

The lanes form a ladder, smallest share first, the whole device last. The controller keeps one rung:
* no decode batch running when a chunk starts: the chunk gets the whole device (top rung), and the
  rung is left as it was (that chunk's decode gaps say nothing about it);
* otherwise, the decode output gaps (one step's tokens to the next's) measured beside the previous
  chunk on the rung decide: their `QUANTILE` above the inter-token target -> one rung down (decode
  gets more SMs); below `grow_below` x target -> one rung up (prefill gets more), but never to the
  whole device while decode runs; in between -> stay. (On the H200, 8B shape, the chunks that ran on
  the whole device beside decode steps made the longest gaps, up to 244 ms: a decode kernel waits
  there for the prefill GEMM's waves to drain; on a share it always has SMs of its own.
  docs/benchmarks.md.)
Decode never needs a share of its own: only prefill is restricted, so with no prefill waiting the
decode steps have every SM. There is no fixed table: the rung follows the measured gaps, which move
with the decode batch size, its contexts and the model.

With `knee` (opt-in, `--mux-split knee`) the gaps are also read against decode's solo gap (the median of
the recent gaps with no chunk in flight): while prefill keeps up (no prompt left waiting when a chunk
starts), the share shrinks once decode beside a chunk is `KNEE` x slower than alone and grows only while
it is under `FLAT` x, so the split sits at the knee, the largest prefill share decode does not feel; a
prompt left waiting lets the share grow up to the target as without it. Why: fixed shares on an H100
(8B shape, 64 decode rows, 6,000-token prompts arriving faster than any share computes them) kept decode
at its solo rate up to 64 of 132 SMs (a step 10.3 ms, prefill 14,300 tokens/s) and slowed it beyond (80:
12.2 ms, 18,800 tokens/s; 112: 18 ms), and the target rule at 30 ms climbs to 112 SMs because it grows
while gaps stay under 18 ms (docs/benchmarks.md).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

QUANTILE = 0.9  # of the decode gaps beside one chunk: one slow outlier step does not move the split
KNEE = 1.25  # with `knee`: decode beside a chunk this much slower than alone -> prefill's share shrinks
FLAT = 1.1  # with `knee`: beside a chunk under this -> decode does not feel it, prefill's share grows
SOLO_WINDOW = 32  # the recent solo gaps whose median is decode's solo gap


@dataclass(frozen=True)
class ControllerConfig:
    """`itl_target_s`: the decode inter-token gap to hold; `grow_below`: the fraction of the target
    under which the prefill share grows; `num_lanes`: rungs of the ladder (the last: whole device);
    `knee`: hold decode near its solo gap while prefill keeps up (the module docstring)."""

    itl_target_s: float
    num_lanes: int
    grow_below: float = 0.6
    knee: bool = False

    def __post_init__(self) -> None:
        if not self.itl_target_s > 0:
            raise ValueError(f"itl_target_s must be positive, got {self.itl_target_s!r}")
        if isinstance(self.num_lanes, bool) or not isinstance(self.num_lanes, int) or self.num_lanes < 1:
            raise ValueError(f"num_lanes must be a positive int, got {self.num_lanes!r}")
        if not 0 < self.grow_below < 1:
            raise ValueError(f"grow_below must be in (0, 1), got {self.grow_below!r}")
        if self.knee not in (True, False):
            raise ValueError(f"knee must be a bool, got {self.knee!r}")


class ShareController:
    """Picks a lane index per prefill chunk (`next_lane`) from decode gaps beside chunks
    (`observe_decode`) and, with `knee`, without one (`observe_solo`)."""

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self.rung = (config.num_lanes - 1) // 2  # start in the middle: half the device or so
        self._chunk_rung: int | None = None  # the rung of the chunk in flight (None: whole, forced)
        self._gaps: list[float] = []
        self._solo: deque[float] = deque(maxlen=SOLO_WINDOW)

    @property
    def whole(self) -> int:
        return self.config.num_lanes - 1

    @property
    def top_beside_decode(self) -> int:
        """The highest rung a chunk gets while decode runs: the largest share short of the whole
        device (the whole device only when it is the one lane there is)."""
        return max(self.whole - 1, 0)

    def next_lane(self, decoding: bool, behind: bool = False) -> int:
        """The lane of the chunk about to start; `decoding`: a decode batch runs beside it; `behind`:
        prompts are left waiting after it (prefill is not keeping up)."""
        self._adjust(behind)
        if not decoding:
            self._chunk_rung = None
            return self.whole
        self._chunk_rung = self.rung
        return self.rung

    def observe_decode(self, seconds: float) -> None:
        """One gap between two decode steps' outputs, measured while the current chunk was in flight."""
        if self._chunk_rung is not None:
            self._gaps.append(seconds)

    def observe_solo(self, seconds: float) -> None:
        """One gap between two decode steps' outputs with no chunk in flight (read with `knee` only)."""
        if self.config.knee:
            self._solo.append(seconds)

    @property
    def solo_seconds(self) -> float | None:
        """Decode's solo gap: the median of the recent gaps with no chunk in flight (None: none seen,
        or `knee` off)."""
        return statistics.median(self._solo) if self._solo else None

    def _adjust(self, behind: bool) -> None:
        gaps, self._gaps = sorted(self._gaps), []
        if not gaps or self._chunk_rung != self.rung:
            return
        gap = gaps[min(len(gaps) - 1, int(QUANTILE * len(gaps)))]
        target = self.config.itl_target_s
        solo = None if behind else self.solo_seconds
        if gap > target or (solo is not None and gap > KNEE * solo):
            self.rung = max(0, self.rung - 1)
        elif gap < self.config.grow_below * target and (solo is None or gap < FLAT * solo):
            self.rung = min(self.top_beside_decode, self.rung + 1)
