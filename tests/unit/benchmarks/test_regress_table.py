"""benchmarks/regress_table.py reads every figure regress.sh writes, the served one included."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.regress_table import collect, rows


def _write(log: Path, name: str, payload) -> None:
    (log / name).write_text(json.dumps(payload))


def test_each_arm_is_compared_with_the_reference_per_figure(tmp_path: Path) -> None:
    for arm, scale in (("base", 1.0), ("new", 1.5)):
        for rnd in (1, 2):
            _write(tmp_path, f"std_{arm}_r{rnd}.json", [{"tok_per_s": 1000.0 * scale}])
            _write(tmp_path, f"serve_{arm}_r{rnd}.json", {"summary": {"output_tokens_per_s": 2000.0 * scale}})
            _write(
                tmp_path,
                f"lat_{arm}_r{rnd}.json",
                {
                    "tpot_ms_by_batch": {"1": 1.0 / scale, "64": 2.0 / scale},
                    "prefill_tok_per_s": 9000.0,
                },
            )
    table = {(r[0], r[1]): r for r in rows(collect(tmp_path), "base")}
    assert table[("serving mixed-1", "new")][2] == "3,000 / 3,000 tok/s"
    assert table[("serving mixed-1", "new")][3] == "1.500x"
    assert table[("TPOT b1 @1k", "new")][3] == "1.500x"  # a latency: lower is faster
    assert table[("prefill 8x2048", "new")][3].startswith("1.000x")
    assert ("mixed (real model)", "new") not in table  # a figure not run is left out


def test_a_figure_the_reference_arm_lacks_is_said_not_skipped(tmp_path: Path) -> None:
    """regress.sh against a base tree its offline script could not import: the base arm wrote no std
    figure, which the table must say instead of showing the new arm alone."""
    for rnd in (1, 2):
        _write(tmp_path, f"std_new_r{rnd}.json", [{"tok_per_s": 1000.0}])
        _write(
            tmp_path,
            f"lat_base_r{rnd}.json",
            {"tpot_ms_by_batch": {"1": 1.0, "64": 2.0}, "prefill_tok_per_s": 9.0},
        )
    table = {(r[0], r[1]): r for r in rows(collect(tmp_path), "base")}
    assert table[("offline std (Qwen3-0.6B shape)", "base")][2].startswith("no result")
    assert table[("offline std (Qwen3-0.6B shape)", "new")][3] == "no reference"
    assert ("mixed (real model)", "base") not in table  # no arm ran it: left out
