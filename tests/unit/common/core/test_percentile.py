"""The one percentile rule (common/core/percentile.py) against numpy's default."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from common.core.percentile import percentile


def test_percentile_matches_numpy():
    assert math.isnan(percentile([], 50))
    assert percentile([4.0], 99) == 4.0
    assert percentile([1, 2, 3, 4], 50) == 2.5
    rng = random.Random(0)
    for n in (2, 3, 10, 101):
        values = [rng.random() for _ in range(n)]
        for q in (0, 1, 50, 90, 99, 100):
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
