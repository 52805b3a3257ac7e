"""A minimal Prometheus text-exposition registry (counters, gauges, histograms with labels).

Written here rather than taken from prometheus_client so that each router instance owns its metrics
(several routers built in one test process must not collide in a global registry) and so the router
has no dependency the project does not declare.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Collection, Sequence
from typing import Any

LabelValues = tuple[str, ...]
# A registry's figures as plain JSON values, {metric name: its state}: what one router front publishes
# for the others to sum (router/front_metrics.py).
Snapshot = dict[str, Any]

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _Metric:
    kind = ""

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        self.name = name
        self.help = help_text
        self.label_names = tuple(labels)

    def _key(self, labels: dict[str, str]) -> LabelValues:
        names = self.label_names
        # As many labels as names, each name among them: the same set, without building two sets
        # (about a dozen label sets per request on the router's request path).
        if len(labels) == len(names):
            try:
                return tuple([str(labels[n]) for n in names]) if names else ()
            except KeyError:
                pass
        raise ValueError(f"{self.name} takes labels {names}, got {tuple(labels)}")

    def _label_text(self, values: LabelValues, extra: tuple[tuple[str, str], ...] = ()) -> str:
        pairs = list(zip(self.label_names, values, strict=True)) + list(extra)
        if not pairs:
            return ""
        return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]

    def render(self) -> list[str]:
        raise NotImplementedError

    def empty(self) -> _Metric:
        """A metric of the same definition holding nothing (what several states are summed into)."""
        return type(self)(self.name, self.help, self.label_names)

    def state(self) -> list:
        """The figures as JSON values."""
        raise NotImplementedError

    def add_state(self, state: list) -> None:
        """Add another instance's `state()` (same definition) to this one's figures."""
        raise NotImplementedError

    def _state_key(self, labels: list) -> LabelValues:
        if not isinstance(labels, list) or len(labels) != len(self.label_names):
            raise ValueError(f"{self.name}: a state's labels {labels!r} do not match {self.label_names}")
        return tuple(str(v) for v in labels)


class _Valued(_Metric):
    """One number per label set: counters and gauges, whose states sum alike (a gauge summed over
    fronts, e.g. requests running, is the cluster's figure)."""

    def __init__(self, name: str, help_text: str, labels: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, labels)
        self._values: dict[LabelValues, float] = {}

    def value(self, **labels: str) -> float:
        return self._values.get(self._key(labels), 0.0)

    def render(self) -> list[str]:
        return [f"{self.name}{self._label_text(k)} {_num(v)}" for k, v in sorted(self._values.items())]

    def state(self) -> list:
        return [[list(k), v] for k, v in self._values.items()]

    def add_state(self, state: list) -> None:
        parsed = [(self._state_key(labels), float(value)) for labels, value in state]
        for key, value in parsed:  # parsed whole first: a bad state changes nothing
            self._values[key] = self._values.get(key, 0.0) + value


class Counter(_Valued):
    kind = "counter"

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: counters only go up, got {amount}")
        key = self._key(labels)
        self._values[key] = self._values.get(key, 0.0) + amount


class Gauge(_Valued):
    kind = "gauge"

    def set(self, value: float, **labels: str) -> None:
        self._values[self._key(labels)] = float(value)

    def clear(self) -> None:
        """Forget all label sets (gauges describing workers are rebuilt at each scrape)."""
        self._values.clear()


class Histogram(_Metric):
    kind = "histogram"

    def __init__(
        self,
        name: str,
        help_text: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> None:
        super().__init__(name, help_text, labels)
        self.buckets = tuple(sorted(buckets))
        self._counts: dict[LabelValues, list[int]] = {}  # per bucket, not cumulative; last = +Inf
        self._sums: dict[LabelValues, float] = {}

    def observe(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        counts = self._counts.setdefault(key, [0] * (len(self.buckets) + 1))
        counts[bisect.bisect_left(self.buckets, value)] += 1
        self._sums[key] = self._sums.get(key, 0.0) + value

    def count(self, **labels: str) -> int:
        return sum(self._counts.get(self._key(labels), ()))

    def render(self) -> list[str]:
        lines = []
        for key, counts in sorted(self._counts.items()):
            cumulative = 0
            for bound, n in zip((*self.buckets, math.inf), counts, strict=True):
                cumulative += n
                le = (("le", "+Inf" if bound == math.inf else _num(bound)),)
                lines.append(f"{self.name}_bucket{self._label_text(key, le)} {cumulative}")
            lines.append(f"{self.name}_sum{self._label_text(key)} {_num(self._sums[key])}")
            lines.append(f"{self.name}_count{self._label_text(key)} {cumulative}")
        return lines

    def empty(self) -> Histogram:
        return Histogram(self.name, self.help, self.label_names, self.buckets)

    def state(self) -> list:
        return [[list(k), counts, self._sums[k]] for k, counts in self._counts.items()]

    def add_state(self, state: list) -> None:
        parsed = [
            (self._state_key(labels), self._state_counts(counts), float(total))
            for labels, counts, total in state
        ]
        for key, counts, total in parsed:  # parsed whole first: a bad state changes nothing
            mine = self._counts.setdefault(key, [0] * (len(self.buckets) + 1))
            self._counts[key] = [a + b for a, b in zip(mine, counts, strict=True)]
            self._sums[key] = self._sums.get(key, 0.0) + total

    def _state_counts(self, counts: list) -> list[int]:
        if not isinstance(counts, list) or len(counts) != len(self.buckets) + 1:
            raise ValueError(
                f"{self.name}: a state's bucket counts do not fit its {len(self.buckets)} buckets"
            )
        return [int(n) for n in counts]


class MetricsRegistry:
    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}

    def counter(self, name: str, help_text: str, labels: Sequence[str] = ()) -> Counter:
        return self._add(Counter(name, help_text, labels))

    def gauge(self, name: str, help_text: str, labels: Sequence[str] = ()) -> Gauge:
        return self._add(Gauge(name, help_text, labels))

    def histogram(
        self,
        name: str,
        help_text: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> Histogram:
        return self._add(Histogram(name, help_text, labels, buckets))

    def _add(self, metric):
        if metric.name in self._metrics:
            raise ValueError(f"metric {metric.name} is already registered")
        self._metrics[metric.name] = metric
        return metric

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._metrics)

    def kind(self, name: str) -> str:
        """ "counter", "gauge" or "histogram"."""
        return self._metrics[name].kind

    def snapshot(self, names: Collection[str]) -> Snapshot:
        """The state of the metrics named in `names`, as JSON values."""
        return {name: m.state() for name, m in self._metrics.items() if name in names}

    def summed(self, snapshots: Sequence[Snapshot], names: Collection[str]) -> MetricsRegistry:
        """A registry whose metrics named in `names` hold the sum of `snapshots` (each taken from a
        registry of the same definitions; ValueError on one that does not fit) and whose other
        metrics are this registry's own."""
        out = MetricsRegistry()
        for name, metric in self._metrics.items():
            if name in names:
                metric = metric.empty()
                for snapshot in snapshots:
                    metric.add_state(snapshot.get(name, []))
            out._metrics[name] = metric
        return out

    def render(self, front: int | None = None) -> str:
        """The exposition text; `front` (one of several router fronts) labels every sample `front="i"`."""
        lines: list[str] = []
        for metric in self._metrics.values():
            samples = metric.render()
            lines += metric.header() + (
                samples if front is None else [_with_front(s, front) for s in samples]
            )
        return "\n".join(lines) + "\n"


def _with_front(sample: str, front: int) -> str:
    name, sep, rest = sample.partition("{")
    if sep:
        return f'{name}{{front="{front}",{rest}'
    name, _, value = sample.partition(" ")
    return f'{name}{{front="{front}"}} {value}'


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)
