"""The figures of one benchmarks/serving/router_throughput.py run and how they are printed (the per-run
summary, the sweep table).

Kept apart from the script, which starts and times the fronts, workers and clients: the figures are
arithmetic over what the clients counted and the CPU time read around the run, and the tables read
nothing but those figures, so either can change without touching the processes.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from benchmarks.serving.sse_clients import ClientResult
from common.core.percentile import percentile

if TYPE_CHECKING:
    from benchmarks.serving.router_throughput import Load


def front_ttft(before: tuple[float, int] | None, after: tuple[float, int] | None) -> dict:
    """The fronts' own mean TTFT over the run (RouterFronts.ttft_totals); nothing for a bare front."""
    if before is None or after is None or after[1] <= before[1]:
        return {}
    return {"front_ttft_ms_mean": 1e3 * (after[0] - before[0]) / (after[1] - before[1])}


def run_summary(
    a: argparse.Namespace, load: Load, results: list[ClientResult], wall: float, cpu: list
) -> dict:
    tokens, chunks = sum(r.tokens for r in results), sum(r.chunks for r in results)
    requests, total_cpu = sum(r.requests for r in results), sum(cpu)
    ttft = [t for r in results for t in r.ttft_ms]
    return {
        "api_servers": load.fronts,
        "output_tokens_per_s": tokens / wall,
        "sse_chunks_per_s": chunks / wall,
        "tokens_per_chunk": tokens / chunks if chunks else 0.0,
        "requests_per_s": requests / wall,
        "errors": sum(r.errors for r in results),
        "first_error": next((r.first_error for r in results if r.first_error), ""),
        "router_cpu_cores": total_cpu / wall,  # summed over the fronts
        "router_cpu_cores_per_front": [round(c / wall, 2) for c in cpu],
        "router_cpu_us_per_token": 1e6 * total_cpu / tokens if tokens else 0.0,
        "router_cpu_us_per_request": 1e6 * total_cpu / requests if requests else 0.0,
        "ttft_ms_p50": percentile(ttft, 50),
        "ttft_ms_p99": percentile(ttft, 99),
        "ttft_ms_mean": sum(ttft) / len(ttft) if ttft else 0.0,
        "wall_s": wall,
        "load": vars(load),
        "args": vars(a),
    }


def print_summary(summary: dict) -> None:
    for key, value in summary.items():
        if key not in ("args", "load"):
            print(f"{key:<27}{value:>16.1f}" if isinstance(value, float) else f"{key:<27}{value!s:>16}")


def print_sweep(rows: list[dict]) -> None:
    """One row per front count; scaling = (rate per front) / (the first row's rate per front). The
    workers' and clients' cores show whether they, not the fronts, limited a row."""
    base = rows[0]
    head = ("fronts", "tok/s", "req/s", "cores", "us/tok", "us/req", "tok x lin", "req x lin")
    head += ("wrk cores", "cli cores", "errors")
    print(("{:>7}" + "{:>11}" * (len(head) - 1)).format(*head))
    for r in rows:
        scale = [_scaling(r, base, key) for key in ("output_tokens_per_s", "requests_per_s")]
        cells = (r["output_tokens_per_s"], r["requests_per_s"], r["router_cpu_cores"])
        cells += (r["router_cpu_us_per_token"], r["router_cpu_us_per_request"], *scale)
        cells += (r["worker_cpu_cores"], r["client_cpu_cores"])
        print(f"{r['api_servers']:>7}" + "".join(f"{c:>11.2f}" for c in cells) + f"{r['errors']:>11}")


def _scaling(row: dict, base: dict, key: str) -> float:
    per_front = base[key] / base["api_servers"]
    return row[key] / row["api_servers"] / per_front if per_front else 0.0
