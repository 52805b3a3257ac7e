"""benchmarks/engine/pd_multiplex.py runs end to end on the CPU with a tiny model (smoke test)."""

from __future__ import annotations

import pytest

from benchmarks.engine import pd_multiplex


def test_every_arm_runs_and_reports(tiny_model_dirs, capsys):
    argv = ["--model", tiny_model_dirs["qwen3"], "--device", "cpu", "--streams", "2", "--long-prompt", "48"]
    argv += ["--long-count", "2", "--long-interval-s", "0.01", "--chunks", "16,32", "--rounds", "1"]
    results = pd_multiplex.main([*argv, "--max-model-len", "512", "--mux-arms", "30,5:sync:parts"])
    assert list(results) == ["agg-16", "agg-32", "mux-30", "mux-5:sync:parts"]
    for runs in results.values():
        assert len(runs) == 1 and len(runs[0].ttfts) == 2 and runs[0].gaps
    out = capsys.readouterr().out
    assert "ITL p99" in out and "met SLO" in out


def test_met_slo_counts_streams_by_their_worst_gap_and_long_prompts_by_ttft():
    run = pd_multiplex.RunStats(worst_gap={"s0": 0.01, "s1": 0.08}, ttfts=[0.5, 2.0])
    assert pd_multiplex.met_slo([run], itl_s=0.05, ttft_s=1.0) == 0.5  # s0 and the first long prompt
    assert pd_multiplex.met_slo([run, run], itl_s=0.1, ttft_s=3.0) == 1.0


@pytest.mark.parametrize("spec", ["0", "fast", "10:quick"])
def test_bad_mux_arm_is_refused_before_loading(spec):
    with pytest.raises(ValueError, match="--mux-arms"):
        pd_multiplex.main(["--model", "/nonexistent", "--mux-arms", spec])
