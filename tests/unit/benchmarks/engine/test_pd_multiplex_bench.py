"""benchmarks/engine/pd_multiplex.py runs end to end on the CPU with a tiny model (smoke test)."""

from __future__ import annotations

import pytest

from benchmarks.engine import pd_multiplex


def test_every_arm_runs_and_reports(tiny_model_dirs, capsys):
    argv = ["--model", tiny_model_dirs["qwen3"], "--device", "cpu", "--streams", "2", "--long-prompt", "48"]
    argv += ["--long-count", "2", "--long-interval-s", "0.01", "--chunks", "16,32", "--rounds", "1"]
    results = pd_multiplex.main(
        [*argv, "--max-model-len", "512", "--mux-arms", "30,5:sync:parts,30:c64:knee", "--step-classes"]
    )
    assert list(results) == ["agg-16", "agg-32", "mux-30", "mux-5:sync:parts", "mux-30:c64:knee"]
    for name, runs in results.items():
        assert len(runs) == 1 and len(runs[0].ttfts) == 2 and runs[0].gaps
        classes = runs[0].classes
        # Every gap is traced to the step that closed it; prompts were computed in some step.
        assert sum(map(len, classes.gaps.values())) == len(runs[0].gaps)
        prompt_kinds = {"with prefill"} if name.startswith("agg") else {"launch", "resolve+launch"}
        assert prompt_kinds & set(classes.step_seconds), (name, set(classes.step_seconds))
    out = capsys.readouterr().out
    assert "ITL p99" in out and "met SLO" in out and "prefill tok/s" in out
    assert "tail gaps" in out


def test_mux_arm_options_parse_into_a_fixed_share_and_a_chunk():
    arm = pd_multiplex.parse_mux_arm("10:sync:sms64:c2048")
    assert (arm.target_ms, arm.options, arm.sms, arm.chunk) == (10.0, frozenset({"sync"}), 64, 2048)
    assert pd_multiplex.parse_mux_arm("30") == pd_multiplex.MuxArm(30.0, frozenset())


def test_a_fixed_share_keeps_its_lane_beside_decode_whatever_the_gaps():
    from common.multiplex.controller import ControllerConfig, ShareController

    fixed = pd_multiplex.FixedShare(ShareController(ControllerConfig(0.01, num_lanes=4)), lane=0)
    for _ in range(3):
        assert fixed.next_lane(True, behind=bool(_ % 2)) == 0  # as the stepper calls it
        fixed.observe_decode(1.0)  # far over the target: a controller would move, this one does not
    assert fixed.next_lane(decoding=False) == 3  # nothing decodes: the whole device


def test_a_share_the_device_lacks_is_refused_naming_the_shares(tiny_model_dirs):
    argv = ["--model", tiny_model_dirs["qwen3"], "--device", "cpu", "--streams", "1", "--rounds", "1"]
    with pytest.raises(ValueError, match="no 64-SM share"):  # the CPU has one lane, the whole device
        pd_multiplex.main([*argv, "--chunks", "16", "--max-model-len", "256", "--mux-arms", "30:sms64"])


def test_met_slo_counts_streams_by_their_worst_gap_and_long_prompts_by_ttft():
    run = pd_multiplex.RunStats(worst_gap={"s0": 0.01, "s1": 0.08}, ttfts=[0.5, 2.0])
    assert pd_multiplex.met_slo([run], itl_s=0.05, ttft_s=1.0) == 0.5  # s0 and the first long prompt
    assert pd_multiplex.met_slo([run, run], itl_s=0.1, ttft_s=3.0) == 1.0


@pytest.mark.parametrize("spec", ["0", "fast", "10:quick", "10:sms", "10:c0", "10:sms64x"])
def test_bad_mux_arm_is_refused_before_loading(spec):
    with pytest.raises(ValueError, match="--mux-arms"):
        pd_multiplex.main(["--model", "/nonexistent", "--mux-arms", spec])
