"""benchmarks/serving/stage_metrics.py against the router's own /metrics exposition."""

from __future__ import annotations

import math
import random

import pytest

from benchmarks.serving.stage_metrics import Histogram, parse_stage_histograms, stage_breakdown
from common.core.percentile import percentile
from router.router_metrics import STAGE_BUCKETS, RouterMetrics


def test_the_breakdown_is_what_happened_between_two_scrapes() -> None:
    m = RouterMetrics()
    m.stage_seconds.observe(30.0, stage="prefill")
    before = m.registry.render()
    rng = random.Random(0)
    samples = [rng.uniform(0.01, 0.05) for _ in range(400)]
    for v in samples:
        m.stage_seconds.observe(v, stage="prefill")
    m.stage_seconds.observe(0.002, stage="router_queue")
    rows = stage_breakdown(before, m.registry.render())
    assert set(rows) == {"prefill", "router_queue"}
    p = rows["prefill"]
    assert p["count"] == 400 and p["mean_ms"] == pytest.approx(1e3 * sum(samples) / 400)
    # bucket interpolation: within the bucket holding the true quantile, here (25 ms, 50 ms]
    true_p50 = percentile([1e3 * v for v in samples], 50)
    assert 25 < p["p50_ms"] <= 50 and abs(p["p50_ms"] - true_p50) < 25
    assert 25 < p["p99_ms"] <= 50
    assert rows["router_queue"]["count"] == 1 and 1 < rows["router_queue"]["p50_ms"] <= 2.5


def test_parse_reads_buckets_sum_and_count() -> None:
    m = RouterMetrics()
    m.stage_seconds.observe(100.0, stage="decode")  # beyond the last bucket
    hist = parse_stage_histograms(m.registry.render())["decode"]
    assert (hist.count, hist.sum) == (1, 100.0) and len(hist.buckets) == len(STAGE_BUCKETS) + 1
    assert hist.quantile(0.5) == STAGE_BUCKETS[-1]  # past the last finite bound, that bound is all we know
    assert math.isnan(Histogram().quantile(0.5))
    assert parse_stage_histograms("# HELP x\nother_metric 1\n") == {} and stage_breakdown("", "") == {}
