"""One percentile rule for every figure the project reports (the worker's stats line, the serving and
engine benchmarks), so that a p99 in a log line and one in a benchmark table mean the same thing."""

from __future__ import annotations

import math


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), `q` in percent; NaN when there is
    nothing."""
    if not values:
        return math.nan
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)
