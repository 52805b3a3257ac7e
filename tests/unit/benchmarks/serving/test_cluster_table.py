"""benchmarks/serving/cluster_table.py: repeats aggregate to one row (median, min-max); the issues' summary
lines come from the runs that are present."""

from __future__ import annotations

import json
import math

from benchmarks.serving.cluster_table import render, rows, summary_lines


def _row(setup: str, workload: str, tok_s: float) -> dict:
    return {"setup": setup, "workload": workload, "tok_s": tok_s}


def test_two_gpu_line_needs_the_nccl_random_run_and_the_offline_figure() -> None:
    table = [_row("nccl", "random", 37111.4), _row("nccl", "multiturn", 1.0), _row("mixed", "random", 5.0)]
    assert summary_lines(table, 52295.0) == [
        "disaggregated H200x2 1P+1D: 37,111 tok/s (offline one GPU: 52,295 tok/s)"
    ]
    assert summary_lines(table, None) == []


def test_four_gpu_line_compares_one_plus_three_with_the_colocated_workers() -> None:
    table = [
        _row("1p3d", "random", 120000.2),
        _row("mixed", "random", 130500.0),
        _row("1p3d", "interference", 1.0),
    ]
    assert summary_lines(table, 50000.0) == [
        "four GPUs H200x4 1P+3D: 120,000 tok/s (4 colocated: 130,500 tok/s)"
    ]
    assert summary_lines([_row("1p3d", "multiturn", 1.0), _row("mixed", "random", 2.0)], None) == []


def _write_run(log, setup: str, name: str, tok_s: float, ttft_p50: float, goodput=None) -> None:
    stats = {"p50": ttft_p50, "p99": 2 * ttft_p50}
    summary = {
        "output_tokens_per_s": tok_s,
        "duration_s": 31.0,
        "failed": 0,
        "ttft_ms": stats,
        "tpot_ms": {"p50": 3.0, "p99": 4.0},
        "itl_ms": {"p50": 3.0, "p99": 5.0, "max": 40.0},
        "goodput_per_s": goodput,
    }
    (log / setup).mkdir(parents=True, exist_ok=True)
    (log / setup / f"{name}.json").write_text(json.dumps({"summary": summary}))


def test_repeats_are_one_row_with_median_and_range(tmp_path) -> None:
    for name, tok_s, ttft, goodput in (
        ("random", 30000.0, 500.0, 4.0),
        ("random.r2", 20000.0, 700.0, 2.0),
        ("random.r3", 25000.0, 600.0, 3.0),
    ):
        _write_run(tmp_path, "nccl", name, tok_s, ttft, goodput)
    _write_run(tmp_path, "nccl", "multiturn", 9000.0, 100.0)
    table = {r["workload"]: r for r in rows(tmp_path)}
    random = table["random"]
    assert (random["runs"], random["tok_s"], random["tok_s_range"]) == (3, 25000.0, (20000.0, 30000.0))
    assert random["ttft"] == (600.0, 1200.0) and random["itl"] == (5.0, 40.0)
    assert random["goodput"] == 3.0 and math.isnan(table["multiturn"]["goodput"])  # no SLO given there
    assert table["multiturn"]["runs"] == 1
    text = render(list(table.values()), None)
    assert "| nccl | random | 3 | 25,000 (20,000-30,000) | 31 |" in text and "| 5.0 / 40.0 | 3.00 |" in text
    assert summary_lines(list(table.values()), 50000.0)[0].startswith("disaggregated H200x2 1P+1D: 25,000")
