"""The table at the end of `benchmarks/serving/gpu_cluster.sh`: one row per setup and workload.

    python benchmarks/serving/cluster_table.py LOG_DIR

Reads LOG_DIR/offline.json (benchmarks/engine/offline.py) and LOG_DIR/<setup>/<workload>[.rN].json
(benchmarks/serving/serving.py; .r2, .r3 ...: repeats) with the router's /metrics scraped before and
after each run, and prints per setup and workload, over its runs: output tok/s as median (min-max), the median
run length, and the medians of TTFT and TPOT p50/p99, inter-token latency p99/max, the KV moved and
its rate and the mean time per stage (router queue, prefill queue, prefill, transfer, decode admission,
decode); the disaggregation decisions and failures are the runs' totals. Two runs of one setup can
differ by tens of percent: read the range before the median. For the interference workload TTFT is
the long prompts' and TPOT the chat requests'. Ends with the summary
lines of the runs present: `disaggregated H200x2 1P+1D: N tok/s (offline one GPU: M tok/s)` (N: 1P+1D
over nccl on the random workload) and, for `benchmarks/serving/gpu_four.sh`, `four GPUs H200x4 1P+3D: N tok/s
(4 colocated: M tok/s)` (random workload).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from collections import Counter, defaultdict
from pathlib import Path

STAGES = ("router_queue", "prefill_queue", "prefill", "transfer", "decode_admission", "decode")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {'name{labels}': value} (comments dropped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def metric_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def stage_means_ms(delta: dict[str, float]) -> dict[str, float]:
    """Mean seconds per stage (as ms) from the pdserve_stage_seconds histogram's sum and count."""
    out = {}
    for stage in STAGES:
        key = f'{{stage="{stage}"}}'
        count = delta.get(f"pdserve_stage_seconds_count{key}", 0.0)
        if count > 0:
            out[stage] = 1e3 * delta[f"pdserve_stage_seconds_sum{key}"] / count
    return out


def kv_figures(delta: dict[str, float]) -> tuple[float, float]:
    """(GB moved, GB/s per transfer-second) from the router's transfer counters."""
    gbytes = delta.get("pdserve_kv_transfer_bytes_total", 0.0) / 1e9
    seconds = delta.get("pdserve_kv_transfer_seconds_sum", 0.0)
    return gbytes, (gbytes / seconds if seconds > 0 else 0.0)


def decisions(delta: dict[str, float]) -> Counter:
    return Counter(
        {
            m.group(1): int(v)
            for k, v in delta.items()
            if (m := re.match(r'pdserve_disagg_decisions_total\{decision="(\w+)"\}', k)) and v
        }
    )


def rows(log: Path) -> list[dict]:
    """One row per setup and workload, its runs (repeats) aggregated."""
    runs: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for run in run_rows(log):
        runs[(run["setup"], run["workload"])].append(run)
    return [aggregate(group) for group in runs.values()]


def aggregate(runs: list[dict]) -> dict:
    """Medians over the runs, the output rate's min and max, the failures and decisions summed."""

    def med(get) -> float:
        return statistics.median(get(r) for r in runs)

    def pair(key: str) -> tuple[float, float]:
        return (med(lambda r: r[key][0]), med(lambda r: r[key][1]))

    rates = [r["tok_s"] for r in runs]
    stages = {s for r in runs for s in r["stages"]}
    return {
        "setup": runs[0]["setup"],
        "workload": runs[0]["workload"],
        "runs": len(runs),
        "tok_s": statistics.median(rates),
        "tok_s_range": (min(rates), max(rates)),
        "duration_s": med(lambda r: r["duration_s"]),
        "ttft": pair("ttft"),
        "tpot": pair("tpot"),
        "itl": pair("itl"),
        "goodput": med(lambda r: r["goodput"]),
        "failed": sum(r["failed"] for r in runs),
        "kv": pair("kv"),
        "stages": {s: statistics.median(r["stages"][s] for r in runs if s in r["stages"]) for s in stages},
        "decisions": sum((r["decisions"] for r in runs), Counter()),
    }


def run_rows(log: Path) -> list[dict]:
    """One row per run: LOG/<setup>/<workload>.json, and its repeats <workload>.r2.json, ..."""
    out = []
    for path in sorted(log.glob("*/*.json")):
        setup, workload = path.parent.name, re.sub(r"\.r\d+$", "", path.stem)
        doc = json.loads(path.read_text())
        s, by_kind = doc["summary"], doc.get("by_kind") or {}
        # Interference: TPOT of the steady chat stream, TTFT of the long prompts that disturb it.
        tpot_of, ttft_of = by_kind.get("chat", s), by_kind.get("long", s)
        before, after = (log / setup / f"{path.stem}.metrics.{w}" for w in ("before", "after"))
        delta = {}
        if before.exists() and after.exists():
            delta = metric_delta(parse_metrics(before.read_text()), parse_metrics(after.read_text()))
        gb, gbps = kv_figures(delta)
        out.append(
            {
                "setup": setup,
                "workload": workload,
                "tok_s": s["output_tokens_per_s"],
                "duration_s": s["duration_s"],
                "ttft": (ttft_of["ttft_ms"]["p50"], ttft_of["ttft_ms"]["p99"]),
                "tpot": (tpot_of["tpot_ms"]["p50"], tpot_of["tpot_ms"]["p99"]),
                "itl": _itl(tpot_of),
                "goodput": _or_nan(s.get("goodput_per_s")),
                "failed": s["failed"],
                "kv": (gb, gbps),
                "stages": stage_means_ms(delta),
                "decisions": decisions(delta),
            }
        )
    return out


def _or_nan(value: float | None) -> float:
    return float("nan") if value is None else value


def _itl(summary: dict) -> tuple[float, float]:
    """Inter-token latency p99 and max (NaN for a run from before serving.py measured it)."""
    itl = summary.get("itl_ms") or {}
    return (itl.get("p99") or float("nan"), itl.get("max") or float("nan"))


def offline_tok_s(log: Path) -> float | None:
    """The one-GPU offline engine's output tok/s (LOG/offline.json, benchmarks/engine/offline.py), if run."""
    path = log / "offline.json"
    return json.loads(path.read_text())[0]["tok_per_s"] if path.exists() else None


def render(table: list[dict], offline: float | None) -> str:
    head = "| setup | workload | runs | output tok/s median (min-max) | run s | TTFT p50/p99 ms | "
    head += "TPOT p50/p99 ms | ITL p99/max ms | goodput req/s | KV GB (GB/s) | "
    head += " / ".join(STAGES) + " (mean ms) | decisions | failed |"
    lines = [head, "|" + " --- |" * 13]
    if offline:
        lines.append(f"| offline (1 GPU) | random | 1 | {offline:,.0f} | - | - | - | - | - | - | - | - | 0 |")
    for r in table:
        stages = " / ".join(f"{r['stages'][s]:.0f}" if s in r["stages"] else "-" for s in STAGES)
        low, high = r["tok_s_range"]
        found = " ".join(f"{k}:{v}" for k, v in sorted(r["decisions"].items())) or "-"
        lines.append(
            f"| {r['setup']} | {r['workload']} | {r['runs']} | {r['tok_s']:,.0f} ({low:,.0f}-{high:,.0f}) | "
            f"{r['duration_s']:.0f} | {r['ttft'][0]:.0f} / {r['ttft'][1]:.0f} | "
            f"{r['tpot'][0]:.2f} / {r['tpot'][1]:.2f} | {r['itl'][0]:.1f} / {r['itl'][1]:.1f} | "
            f"{r['goodput']:.2f} | {r['kv'][0]:.2f} ({r['kv'][1]:.1f}) | {stages} | {found} | {r['failed']} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("log", type=Path)
    a = p.parse_args()
    offline = offline_tok_s(a.log)
    table = rows(a.log)
    print(render(table, offline))
    for line in summary_lines(table, offline):
        print(line)


def summary_lines(table: list[dict], offline: float | None) -> list[str]:
    """The issues' summary lines, for the setups this run has (random workload; medians of its runs)."""
    by: dict[str, dict[str, dict]] = defaultdict(dict)
    for r in table:
        by[r["setup"]][r["workload"]] = r
    random = {setup: runs["random"]["tok_s"] for setup, runs in by.items() if "random" in runs}
    lines = []
    if "nccl" in random and offline:
        n, m = f"{random['nccl']:,.0f}", f"{offline:,.0f}"
        lines.append(f"disaggregated H200x2 1P+1D: {n} tok/s (offline one GPU: {m} tok/s)")
    if "1p3d" in random and "mixed" in random:
        n, m = f"{random['1p3d']:,.0f}", f"{random['mixed']:,.0f}"
        lines.append(f"four GPUs H200x4 1P+3D: {n} tok/s (4 colocated: {m} tok/s)")
    return lines


if __name__ == "__main__":
    main()
