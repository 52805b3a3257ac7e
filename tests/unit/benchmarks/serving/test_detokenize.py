"""benchmarks/serving/detokenize.py runs both arms on the default model's tokenizer and prints one
line per arm with a figure per round; benchmarks/serving/wakeup_cost.py prints its two figures."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]


def test_prints_each_arm_per_round() -> None:
    script = ROOT / "benchmarks" / "serving" / "detokenize.py"
    args = ["--streams", "4", "--tokens", "16", "--rounds", "2", "--stop", "zz"]
    out = subprocess.run(
        [sys.executable, str(script), *args], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    lines = out.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["window", "bytes"]
    for line in lines:
        figures = re.findall(r"\d+\.\d+", line)
        assert len(figures) == 3 and all(float(f) > 0 for f in figures)  # two rounds and the median


def test_wakeup_cost_prints_both_figures() -> None:
    script = ROOT / "benchmarks" / "serving" / "wakeup_cost.py"
    out = subprocess.run(
        [sys.executable, str(script), "--items", "2000", "--layers", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert re.search(r"^async-generator layer: -?\d+\.\d+ us", out, re.M)
    assert re.search(r"^wakeup through a future: \d+\.\d+ us", out, re.M)
