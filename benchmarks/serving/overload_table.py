"""The table of benchmarks/serving/overload.sh: per run, the closed-loop peak and what completed when
MULT x that rate was offered; then the median ratio (the issue's goal: >= 0.90).

    python benchmarks/serving/overload_table.py LOG_DIR
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def row(run: int, peak: dict, over: dict) -> dict:
    p, o = peak["summary"], over["summary"]
    shed = sum("429" in e for e in over.get("errors", []))
    return {
        "run": run,
        "peak_per_s": p["request_throughput_per_s"],
        "offered_per_s": over["args"]["request_rate"],
        "completed_per_s": o["request_throughput_per_s"],
        "failed": o["failed"],
        "first_errors_429": shed,
        "ttft_p50_ms": o["ttft_ms"].get("p50"),
        "ratio": o["request_throughput_per_s"] / p["request_throughput_per_s"],
    }


def table(log: Path) -> list[dict]:
    rows = []
    for peak_path in sorted(log.glob("peak.r*.json")):
        run = int(peak_path.stem.split(".r")[1])
        over_path = log / f"over.r{run}.json"
        if over_path.exists():
            rows.append(row(run, load(peak_path), load(over_path)))
    return rows


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    rows = table(Path(argv[0]))
    if not rows:
        print("no runs found", file=sys.stderr)
        return 1
    print(
        "| run | peak req/s (closed loop) | offered req/s | completed req/s | not completed "
        "| TTFT p50 ms | ratio |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['run']} | {r['peak_per_s']:.2f} | {r['offered_per_s']:.2f} | {r['completed_per_s']:.2f} "
            f"| {r['failed']} | {r['ttft_p50_ms']:.0f} | {r['ratio']:.3f} |"
        )
    print(f"median ratio: {statistics.median(r['ratio'] for r in rows):.3f} (goal >= 0.90)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
