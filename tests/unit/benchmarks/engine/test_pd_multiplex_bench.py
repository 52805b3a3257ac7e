"""benchmarks/engine/pd_multiplex.py runs end to end on the CPU with a tiny model (smoke test)."""

from __future__ import annotations

import pytest

from benchmarks.engine import pd_multiplex


def test_every_arm_runs_and_reports(tiny_model_dirs, capsys):
    argv = ["--model", tiny_model_dirs["qwen3"], "--device", "cpu", "--streams", "2", "--long-prompt", "48"]
    argv += ["--long-count", "2", "--long-interval-s", "0.01", "--chunks", "16,32", "--rounds", "1"]
    results = pd_multiplex.main([*argv, "--max-model-len", "512", "--mux-arms", "30,5:sync"])
    assert list(results) == ["agg-16", "agg-32", "mux-30", "mux-5:sync"]
    for runs in results.values():
        assert len(runs) == 1 and len(runs[0].ttfts) == 2 and runs[0].gaps
    assert "ITL p99" in capsys.readouterr().out


@pytest.mark.parametrize("spec", ["0", "fast", "10:quick"])
def test_bad_mux_arm_is_refused_before_loading(spec):
    with pytest.raises(ValueError, match="--mux-arms"):
        pd_multiplex.main(["--model", "/nonexistent", "--mux-arms", spec])
