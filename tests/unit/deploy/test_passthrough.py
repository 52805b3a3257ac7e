"""Launcher flags handed on to the router and to every worker, and only when given."""

from __future__ import annotations

import pytest

from common.tools.default_model import prepare_default_model
from deploy.launch import parse_args
from deploy.plan import worker_specs


def test_given_flags_reach_router_and_workers():
    model = str(prepare_default_model(progress=False))
    plan = parse_args(
        ["--model", model, "--request-timeout", "15", "--max-running-requests", "64", "--kv-lease-s", "2"]
    )
    assert plan.router_argv == ("--request-timeout", "15.0", "--max-running-requests", "64")
    assert plan.worker_argv == ("--kv-lease-s", "2.0")
    for spec in worker_specs(plan, "tcp://127.0.0.1:5000", num_gpus=0):
        assert spec.argv[-2:] == ["--kv-lease-s", "2.0"]


def test_absent_flags_leave_child_defaults_alone():
    plan = parse_args(["--model", str(prepare_default_model(progress=False))])
    assert plan.router_argv == () and plan.worker_argv == ()


def test_mixed_flag(capsys):
    model = str(prepare_default_model(progress=False))
    plan = parse_args(["--model", model, "--prefill", "0", "--decode", "0", "--mixed", "2"])
    assert (plan.num_prefill, plan.num_decode, plan.num_mixed) == (0, 0, 2)
    assert parse_args(["--model", model]).num_mixed == 0
    with pytest.raises(SystemExit) as exc:
        parse_args(["--model", model, "--decode", "0"])
    assert exc.value.code == 2 and "could decode" in capsys.readouterr().err


def test_disagg_flags_reach_the_router_and_bad_modes_fail_in_the_launcher(capsys):
    model = str(prepare_default_model(progress=False))
    plan = parse_args(["--model", model, "--disagg", "auto", "--disagg-stall-weight", "0.5"])
    assert plan.router_argv == ("--disagg", "auto", "--disagg-stall-weight", "0.5")
    with pytest.raises(SystemExit):
        parse_args(["--model", model, "--disagg", "sometimes"])
    assert "--disagg" in capsys.readouterr().err


def test_generation_config_reaches_the_router_and_a_bad_one_fails_in_the_launcher(tmp_path, capsys):
    model = str(prepare_default_model(progress=False))
    assert parse_args(["--model", model, "--generation-config", "vllm"]).router_argv == (
        "--generation-config",
        "vllm",
    )
    (tmp_path / "generation_config.json").write_text('{"top_p": 0}')
    for choice, says in ((str(tmp_path), "top_p"), (str(tmp_path / "missing"), "generation_config")):
        with pytest.raises(SystemExit) as exc:
            parse_args(["--model", model, "--generation-config", choice])
        assert exc.value.code == 2 and says in capsys.readouterr().err
