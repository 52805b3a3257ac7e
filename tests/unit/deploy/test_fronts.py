"""How many router fronts the launcher starts when `--api-servers` is not given, and what it checks."""

from __future__ import annotations

import pytest

from common.tools.default_model import prepare_default_model
from deploy.launch import parse_args
from deploy.plan import LaunchPlan


def test_one_front_unless_asked(capsys) -> None:
    model = str(prepare_default_model(progress=False))
    assert parse_args(["--model", model]).api_servers == 1
    assert parse_args(["--model", model, "--api-servers", "3"]).api_servers == 3
    with pytest.raises(SystemExit):
        parse_args(["--model", model, "--api-servers", "0"])  # refused, not the default
    assert "api_servers must be an int >= 1" in capsys.readouterr().err


def test_plan_refuses_no_fronts() -> None:
    with pytest.raises(ValueError, match="api_servers"):
        LaunchPlan(model="/m", api_servers=0)
    with pytest.raises(ValueError, match="inbox-port"):
        LaunchPlan(model="/m", api_servers=2, router_argv=("--inbox-port", "5555"))
