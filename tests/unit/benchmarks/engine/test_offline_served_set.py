"""The offline reference of a served figure runs exactly the served requests (issue 26, item 7)."""

from __future__ import annotations

import sys

import pytest

from benchmarks.engine import offline
from benchmarks.serving.workloads import random_workload


def _args(monkeypatch, *argv: str):
    monkeypatch.setattr(sys, "argv", ["offline.py", *argv])
    return offline.parse_args()


def test_the_served_set_is_serving_py_s_random_workload(monkeypatch) -> None:
    args = _args(
        monkeypatch,
        "--served-set",
        "--num-seqs",
        "5",
        "--input-len",
        "12",
        "12",
        "--output-len",
        "7",
        "7",
        "--seed",
        "3",
    )
    prompts, outputs = offline.make_workload(args)
    served = random_workload(5, 12, 7, 3)
    assert prompts == [r.prompt for r in served]
    assert outputs == [7] * 5


def test_the_served_set_needs_fixed_lengths(monkeypatch) -> None:
    with pytest.raises(SystemExit):
        _args(monkeypatch, "--served-set", "--input-len", "10", "20", "--output-len", "7", "7")
