"""Per-stage latency breakdown from the router's /metrics (`pdserve_stage_seconds{stage=...}`).

`benchmarks/serving/serving.py` scrapes /metrics before and after a run; the difference of the two histograms
is the run's own, and each stage's mean and estimated p50/p99 come from it. Quantiles are estimated
as Prometheus' `histogram_quantile` does: linear interpolation inside the bucket holding the rank.
"""

from __future__ import annotations

import math
import re
import urllib.request
from dataclasses import dataclass, field

STAGE_METRIC = "pdserve_stage_seconds"
_LINE = re.compile(r"^(?P<name>\w+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass
class Histogram:
    buckets: dict[float, float] = field(default_factory=dict)  # upper bound -> cumulative count
    sum: float = 0.0
    count: float = 0.0

    def minus(self, before: Histogram | None) -> Histogram:
        if before is None:
            return self
        buckets = {le: n - before.buckets.get(le, 0.0) for le, n in self.buckets.items()}
        return Histogram(buckets, self.sum - before.sum, self.count - before.count)

    def quantile(self, q: float) -> float:
        """The q-quantile (0..1) estimated from the buckets; NaN without observations."""
        if self.count <= 0:
            return math.nan
        rank, lower, below = q * self.count, 0.0, 0.0
        for le, cumulative in sorted(self.buckets.items()):
            if cumulative >= rank:
                if math.isinf(le):
                    return lower  # beyond the last finite bound: the bound is all we know
                width = cumulative - below
                return lower + (le - lower) * ((rank - below) / width if width else 1.0)
            lower, below = le, cumulative
        return lower


def parse_stage_histograms(text: str, metric: str = STAGE_METRIC) -> dict[str, Histogram]:
    """stage -> histogram, from a Prometheus text exposition."""
    out: dict[str, Histogram] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None or not m["name"].startswith(metric):
            continue
        labels = dict(_LABEL.findall(m["labels"]))
        hist = out.setdefault(labels.get("stage", ""), Histogram())
        suffix, value = m["name"][len(metric) :], float(m["value"])
        if suffix == "_bucket":
            hist.buckets[math.inf if labels["le"] == "+Inf" else float(labels["le"])] = value
        elif suffix == "_sum":
            hist.sum = value
        elif suffix == "_count":
            hist.count = value
    return out


def stage_breakdown(before: str, after: str) -> dict[str, dict]:
    """Per stage, what the run between the two scrapes added: count, mean, p50, p99 (milliseconds)."""
    old = parse_stage_histograms(before)
    rows = {}
    for stage, hist in sorted(parse_stage_histograms(after).items()):
        run = hist.minus(old.get(stage))
        if run.count > 0:
            rows[stage] = {
                "count": int(run.count),
                "mean_ms": 1e3 * run.sum / run.count,
                "p50_ms": 1e3 * run.quantile(0.5),
                "p99_ms": 1e3 * run.quantile(0.99),
            }
    return rows


def scrape(metrics_url: str, timeout_s: float = 10.0) -> str | None:
    """The exposition text, or None when the server has no such page (e.g. not a pdserve router)."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout_s) as resp:
            return resp.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return None


def format_breakdown(rows: dict[str, dict]) -> str:
    lines = [f"{'stage':<20}{'count':>8}{'mean_ms':>12}{'p50_ms':>12}{'p99_ms':>12}"]
    for stage, r in rows.items():
        lines.append(
            f"{stage:<20}{r['count']:>8}{r['mean_ms']:>12.2f}{r['p50_ms']:>12.2f}{r['p99_ms']:>12.2f}"
        )
    return "\n".join(lines)
