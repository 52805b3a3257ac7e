"""The Prometheus text exposition written by router.metrics."""

from __future__ import annotations

import pytest

from router.metrics import MetricsRegistry


def test_exposition_format() -> None:
    r = MetricsRegistry()
    c = r.counter("x_total", "Things.", ["status"])
    g = r.gauge("x_ratio", "A ratio.", ["worker"])
    h = r.histogram("x_seconds", "Latency.", buckets=(0.1, 1.0))
    c.inc(status="ok")
    c.inc(2, status='we"ird')
    g.set(0.25, worker="w1")
    for v in (0.05, 0.1, 0.5, 3.0):
        h.observe(v)
    lines = r.render().splitlines()
    assert "# TYPE x_total counter" in lines and "# HELP x_total Things." in lines
    assert 'x_total{status="ok"} 1' in lines and 'x_total{status="we\\"ird"} 2' in lines
    assert 'x_ratio{worker="w1"} 0.25' in lines
    assert 'x_seconds_bucket{le="0.1"} 2' in lines  # le is inclusive
    assert 'x_seconds_bucket{le="1"} 3' in lines and 'x_seconds_bucket{le="+Inf"} 4' in lines
    assert "x_seconds_count 4" in lines and "x_seconds_sum 3.65" in lines
    assert h.count() == 4 and c.value(status="ok") == 1


def test_misuse_is_refused() -> None:
    r = MetricsRegistry()
    c = r.counter("a_total", "A.", ["x"])
    with pytest.raises(ValueError, match="labels"):
        c.inc(y="1")
    with pytest.raises(ValueError, match="only go up"):
        c.inc(-1, x="1")
    with pytest.raises(ValueError, match="already registered"):
        r.gauge("a_total", "again")
    g = r.gauge("b", "B.", ["w"])
    g.set(1, w="gone")
    g.clear()
    assert "gone" not in r.render()


def test_a_front_labels_every_sample() -> None:
    r = MetricsRegistry()
    r.counter("c_total", "plain").inc()
    r.histogram("h_seconds", "labelled", labels=("worker",), buckets=(1.0,)).observe(0.5, worker="w0")
    text = r.render(front=1)
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    assert samples[0] == 'c_total{front="1"} 1'
    assert samples[1] == 'h_seconds_bucket{front="1",worker="w0",le="1"} 1'
    assert all('front="1"' in s for s in samples) and r.render() == text.replace('front="1",', "").replace(
        '{front="1"}', ""
    )
