"""The serving benchmark's figures: percentiles, goodput, the summary table
(benchmarks/serving/serving.py)."""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from common.core.percentile import percentile


@dataclass
class RequestResult:
    latency_s: float = 0.0
    ttft_s: float | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str = ""  # empty: the request succeeded
    itl_s: list[float] = field(default_factory=list)  # every gap between two text chunks, in order
    sent_at: float = 0.0  # Unix time the request was sent: places its gaps on the cluster logs' clock

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def tpot_s(self) -> float | None:
        if not self.ok or self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


def is_good(
    r: RequestResult, ttft_ms: float | None, tpot_ms: float | None, itl_ms: float | None = None
) -> bool:
    """Every SLO given is met: TTFT, TPOT (the mean gap) and `itl_ms`, which every single gap between
    two streamed chunks must meet (a stall the mean hides misses it)."""
    if not r.ok or (ttft_ms is not None and (r.ttft_s is None or r.ttft_s * 1e3 > ttft_ms)):
        return False
    if itl_ms is not None and r.itl_s and max(r.itl_s) * 1e3 > itl_ms:
        return False
    tpot = r.tpot_s  # None for one-token outputs: no inter-token time to miss the SLO with
    return tpot_ms is None or tpot is None or tpot * 1e3 <= tpot_ms


def _stats_ms(values_s: list[float]) -> dict:
    ms = [v * 1e3 for v in values_s]
    mean = sum(ms) / len(ms) if ms else math.nan
    return {"mean": mean, "p50": percentile(ms, 50), "p99": percentile(ms, 99)}


def _itl_stats_ms(results: list[RequestResult]) -> dict:
    gaps = [g for r in results for g in r.itl_s]
    return _stats_ms(gaps) | {"max": max(gaps) * 1e3 if gaps else math.nan}


LONGEST_GAPS = 5  # the longest inter-token gaps a summary lists, each placed in time


def _longest_gaps(results: list[RequestResult]) -> list[dict]:
    """The longest gaps of any request, longest first: how long, the Unix time the gap ended (what the
    router's and workers' log lines can be matched against) and the completion index of the token that
    ended it. A stall every stream sees shows as many gaps ending at about the same time."""
    return [
        {"ms": gap * 1e3, "ended_at": at, "token": index}
        for gap, at, index in heapq.nlargest(LONGEST_GAPS, _gaps_in_time(results))
    ]


def _gaps_in_time(results: list[RequestResult]) -> Iterator[tuple[float, float, int]]:
    """Every gap as (seconds, Unix time it ended, index of the token that ended it)."""
    for r in results:
        if r.ttft_s is None:
            continue
        at = r.sent_at + r.ttft_s
        for index, gap in enumerate(r.itl_s, start=1):
            at += gap
            yield gap, at, index


def summarize(
    results: list[RequestResult], duration_s: float, ttft_ms=None, tpot_ms=None, itl_ms=None
) -> dict:
    ok = [r for r in results if r.ok]
    duration_s = max(duration_s, 1e-9)
    out_tokens = sum(r.output_tokens for r in ok)
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    slo_given = ttft_ms is not None or tpot_ms is not None or itl_ms is not None
    good = sum(is_good(r, ttft_ms, tpot_ms, itl_ms) for r in results)
    return {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration_s,
        "request_throughput_per_s": len(ok) / duration_s,
        "output_tokens_per_s": out_tokens / duration_s,
        "total_prompt_tokens": prompt_tokens,
        "total_output_tokens": out_tokens,
        "total_cached_tokens": cached,
        "cached_token_ratio": cached / prompt_tokens if prompt_tokens else 0.0,
        "ttft_ms": _stats_ms([r.ttft_s for r in ok if r.ttft_s is not None]),
        "tpot_ms": _stats_ms([t for r in ok if (t := r.tpot_s) is not None]),
        "itl_ms": _itl_stats_ms(ok),
        "itl_longest": _longest_gaps(ok),
        "goodput_per_s": good / duration_s if slo_given else None,
        "goodput_slo": {"ttft_ms": ttft_ms, "tpot_ms": tpot_ms, "itl_ms": itl_ms},
    }


def per_request_ms(results: list[RequestResult]) -> dict[str, list[float]]:
    """Each succeeded request's TTFT and TPOT in ms, rounded to 0.01 ms (keeps the JSON small), for
    distributions (benchmarks/serving/plots.py); TPOT leaves out one-token outputs, which have none."""
    ok = [r for r in results if r.ok]
    return {
        "ttft_ms": [round(r.ttft_s * 1e3, 2) for r in ok if r.ttft_s is not None],
        "tpot_ms": [round(t * 1e3, 2) for r in ok if (t := r.tpot_s) is not None],
    }


def json_safe(obj):
    """inf/NaN (an unlimited rate, a percentile of nothing) become null: strict JSON has neither."""
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    return None if isinstance(obj, float) and not math.isfinite(obj) else obj


def format_table(summary: dict) -> str:
    """One row per figure; the keys carry their units."""
    rows = []
    for key, value in summary.items():
        if isinstance(value, list):  # the longest gaps: one line each
            rows += [(f"{key} {i}", _gap_text(gap)) for i, gap in enumerate(value, start=1)]
            continue
        items = value.items() if isinstance(value, dict) else [("", value)]
        rows += [(f"{key} {sub}".strip(), v) for sub, v in items]
    text = {int: "{}", float: "{:.2f}", type(None): "-", str: "{}"}
    return "\n".join(f"{k:<32}{text[type(v)].format(v):>16}" for k, v in rows)


def _gap_text(gap: dict) -> str:
    clock = time.strftime("%H:%M:%S", time.localtime(gap["ended_at"])) + f"{gap['ended_at'] % 1:.3f}"[1:]
    return f"{gap['ms']:.1f} ms to {clock} (token {gap['token']})"
