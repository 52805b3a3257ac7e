"""What a decode-shaped step costs on this device, measured by the runner (timed CUDA-graph replays)
and read by the speculation policy (`common.spec_decode.spec_policy.StepClock`). It lives with the
runner, which measures it, so the runner never imports the policy."""

from __future__ import annotations

import bisect
from dataclasses import dataclass


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
        return self.sizes[self.slot(rows)]

    def cost(self, rows: int) -> float:
        """Seconds for a step of `rows` rows (padded up to the next measured size)."""
        return self.seconds[self.slot(rows)]

    def slot(self, rows: int) -> int:
        """Index of the measured size a step of `rows` rows runs at."""
        i = bisect.bisect_left(self.sizes, rows)
        if i == len(self.sizes):
            raise ValueError(f"rows ({rows}) exceed the largest measured size ({self.sizes[-1]})")
        return i
