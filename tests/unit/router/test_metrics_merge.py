"""/metrics summed over router fronts: registry snapshots sum (router/metrics.py), and each front's
FrontMetrics publishes its own and sums the others' (router/front_metrics.py)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from router.front_metrics import FrontMetrics, snapshot_path
from router.metrics import MetricsRegistry
from router.router_metrics import RouterMetrics

SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="[^"]*",?)*\})? \S+$')


def _registry() -> MetricsRegistry:
    r = MetricsRegistry()
    r.counter("c_total", "C.", ["status"])
    r.gauge("g", "G.")
    r.histogram("h_seconds", "H.", ["stage"], buckets=(0.1, 1.0))
    r.gauge("own", "Not summed.")
    return r


def _metric(r: MetricsRegistry, name: str):
    return r._metrics[name]


def test_snapshots_sum_counters_gauges_and_buckets() -> None:
    a, b = _registry(), _registry()
    _metric(a, "c_total").inc(status="ok")
    _metric(b, "c_total").inc(2, status="ok")
    _metric(b, "c_total").inc(status="error")
    _metric(a, "g").set(3)
    _metric(b, "g").set(4)
    _metric(a, "h_seconds").observe(0.05, stage="x")
    _metric(b, "h_seconds").observe(0.5, stage="x")
    _metric(b, "h_seconds").observe(5.0, stage="y")
    _metric(a, "own").set(7)
    _metric(b, "own").set(9)
    summed_names = {"c_total", "g", "h_seconds"}
    lines = a.summed([a.snapshot(summed_names), b.snapshot(summed_names)], summed_names).render().splitlines()
    assert 'c_total{status="ok"} 3' in lines and 'c_total{status="error"} 1' in lines
    assert "g 7" in lines and "own 7" in lines  # `own` is the answering registry's alone
    assert 'h_seconds_bucket{stage="x",le="0.1"} 1' in lines
    assert 'h_seconds_bucket{stage="x",le="1"} 2' in lines
    assert 'h_seconds_count{stage="x"} 2' in lines and 'h_seconds_sum{stage="x"} 0.55' in lines
    assert 'h_seconds_bucket{stage="y",le="+Inf"} 1' in lines
    assert _metric(a, "c_total").value(status="ok") == 1  # summing leaves the registry itself alone


def test_a_snapshot_that_does_not_fit_is_refused() -> None:
    r = _registry()
    with pytest.raises(ValueError, match="labels"):
        r.summed([{"c_total": [[["ok", "extra"], 1]]}], {"c_total"})
    with pytest.raises(ValueError, match="bucket counts"):
        r.summed([{"h_seconds": [[["x"], [1, 0], 0.5]]}], {"h_seconds"})


def test_every_front_shows_the_sum_of_all_fronts(tmp_path: Path) -> None:
    fronts = [RouterMetrics(), RouterMetrics()]
    shares = [FrontMetrics(str(tmp_path), i, m) for i, m in enumerate(fronts)]
    for i, m in enumerate(fronts):
        m.requests.inc(i + 1, status="ok")
        m.running.set(i + 2)
        m.ttft.observe(0.02 * (i + 1))
        m.worker_up.set(1, role="decode", worker="decode-0")  # each front's replica of the same worker
    shares[1].publish()
    texts = [share.render() for share in shares]
    for text in texts:
        lines = text.splitlines()
        assert 'pdserve_requests_total{status="ok"} 3' in lines
        assert "pdserve_requests_running 5" in lines
        assert "pdserve_time_to_first_token_seconds_count 2" in lines
        assert 'pdserve_worker_up{role="decode",worker="decode-0"} 1' in lines  # not summed
        assert "pdserve_router_fronts 2" in lines
        _assert_valid_exposition(text)


def test_an_unreadable_snapshot_is_left_out(tmp_path: Path) -> None:
    mine = RouterMetrics()
    mine.requests.inc(status="ok")
    snapshot_path(str(tmp_path), 1).write_text("{not json")
    snapshot_path(str(tmp_path), 2).write_text('{"pdserve_requests_total": [[[], 1]]}')  # wrong labels
    lines = FrontMetrics(str(tmp_path), 0, mine).render().splitlines()
    assert 'pdserve_requests_total{status="ok"} 1' in lines and "pdserve_router_fronts 1" in lines


def test_a_stopping_front_publishes_its_last_figures(tmp_path: Path) -> None:
    metrics = RouterMetrics()
    share = FrontMetrics(str(tmp_path), 0, metrics)

    async def life() -> None:
        share.start()
        metrics.requests.inc(status="ok")
        await share.stop()

    asyncio.run(life())
    other = FrontMetrics(str(tmp_path), 1, RouterMetrics()).render().splitlines()
    assert 'pdserve_requests_total{status="ok"} 1' in other


def test_front_metrics_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="directory"):
        FrontMetrics("", 0, RouterMetrics())
    with pytest.raises(ValueError, match="front"):
        FrontMetrics("/tmp", -1, RouterMetrics())


def _assert_valid_exposition(text: str) -> None:
    """Each family's HELP and TYPE once, before its samples; every sample line well formed."""
    typed: list[str] = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.append(line.split()[2])
        elif not line.startswith("# HELP "):
            assert SAMPLE.match(line), line
            name = re.split(r"[{ ]", line, maxsplit=1)[0]
            assert name in typed or re.sub(r"_(bucket|sum|count)$", "", name) in typed, line
    assert len(typed) == len(set(typed))


def test_a_restarted_front_carries_on_from_its_predecessors_totals(tmp_path: Path) -> None:
    old = RouterMetrics()
    old.requests.inc(3, status="success")
    old.ttft.observe(0.1)
    old.running.set(2)  # died with the old process
    FrontMetrics(str(tmp_path), 0, old).publish()
    new = RouterMetrics()
    share = FrontMetrics(str(tmp_path), 0, new)

    async def restart() -> None:
        share.start()
        new.requests.inc(status="success")
        await share.stop()

    asyncio.run(restart())
    lines = FrontMetrics(str(tmp_path), 1, RouterMetrics()).render().splitlines()
    assert 'pdserve_requests_total{status="success"} 4' in lines  # never drops
    assert "pdserve_time_to_first_token_seconds_count 1" in lines
    assert "pdserve_requests_running 2" not in lines  # gauges are not carried
