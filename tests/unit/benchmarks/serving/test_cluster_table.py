"""benchmarks/serving/cluster_table.py: the issues' summary lines come from the runs that are present."""

from __future__ import annotations

from benchmarks.serving.cluster_table import summary_lines


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
