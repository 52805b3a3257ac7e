"""Launcher flags handed on to the router and to every worker, and only when given; all of them derived
from the router's and the workers' flag tables."""

from __future__ import annotations

import pytest

from common.tools.default_model import prepare_default_model
from common.worker.config import WORKER_FLAGS
from deploy.launch_args import parse_args
from deploy.passthrough import (
    ROUTER_PASSTHROUGH,
    ROUTER_READ,
    ROUTER_SET,
    WORKER_PASSTHROUGH,
    WORKER_READ,
    WORKER_SET,
)
from deploy.plan import worker_specs
from router.flags import ROUTER_FLAGS


def test_given_flags_reach_router_and_workers():
    model = str(prepare_default_model(progress=False))
    plan = parse_args(
        ["--model", model, "--request-timeout", "15", "--max-running-requests", "64", "--kv-lease-s", "2"]
    )
    assert plan.router_argv == ("--request-timeout", "15.0", "--max-running-requests", "64")
    assert plan.worker_argv == ("--kv-lease-s", "2.0")
    for spec in worker_specs(plan, "tcp://127.0.0.1:5000", num_gpus=0):
        assert spec.argv[-2:] == ["--kv-lease-s", "2.0"]


def test_front_flags_reach_the_router():
    model = str(prepare_default_model(progress=False))
    plan = parse_args(["--model", model, "--max-running-requests", "512", "--stream-interval", "4"])
    assert plan.router_argv == ("--max-running-requests", "512", "--stream-interval", "4")


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


def test_the_launcher_derives_every_router_and_worker_flag_from_their_tables(capsys):
    tables = (
        (ROUTER_FLAGS, ROUTER_SET, ROUTER_READ, ROUTER_PASSTHROUGH),
        (WORKER_FLAGS, WORKER_SET, WORKER_READ, WORKER_PASSTHROUGH),
    )
    for table, set_by_launcher, read, passed in tables:
        kinds = [set(set_by_launcher), set(read.fields), set(passed.fields)]
        assert sum(map(len, kinds)) == len(table.fields) and set.union(*kinds) == set(table.fields)
        assert all(
            passed[f] is table[f] and (f not in read.fields or read[f] is table[f]) for f in passed.fields
        )
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    shown = capsys.readouterr().out
    offered = [*ROUTER_READ.flags, *ROUTER_PASSTHROUGH.flags, *WORKER_READ.flags, *WORKER_PASSTHROUGH.flags]
    assert all(f"  {flag.name}" in shown for flag in offered)
    router_options = {f.name: f for f in ROUTER_PASSTHROUGH.flags}
    both = [f for f in WORKER_PASSTHROUGH.flags if f.name in router_options]  # one value for both
    assert [f.name for f in both] == ["--served-model-name"]
    assert all(f.type == router_options[f.name].type for f in both)


def test_a_flag_both_take_reaches_router_and_workers_and_routing_passes_through():
    model = str(prepare_default_model(progress=False))
    plan = parse_args(["--model", model, "--served-model-name", "m", "--routing", "round_robin"])
    assert plan.router_argv == ("--served-model-name", "m", "--routing", "round_robin")
    assert plan.worker_argv == ("--served-model-name", "m")
    plan = parse_args(["--model", model, "--kv-transport", "tcp", "--host", "::1", "--port", "0"])
    assert (plan.kv_transport, plan.host, plan.port, plan.router_argv) == ("tcp", "::1", 0, ())
