"""How many router fronts the launcher starts when `--api-servers` is not given, and what it checks."""

from __future__ import annotations

import pytest

from deploy.fronts import default_api_servers
from deploy.plan import LaunchPlan


def test_default_fronts_follow_the_cores() -> None:
    assert default_api_servers(2, cpu_device=False) == 1  # a small box: one front, as before
    assert default_api_servers(16, cpu_device=False) == 4  # the H200 host
    assert default_api_servers(256, cpu_device=False) == 8
    assert default_api_servers(None, cpu_device=False) == 1
    assert default_api_servers(64, cpu_device=True) == 1  # CPU workers need every core


def test_plan_refuses_no_fronts() -> None:
    with pytest.raises(ValueError, match="api_servers"):
        LaunchPlan(model="/m", api_servers=0)
    with pytest.raises(ValueError, match="inbox-port"):
        LaunchPlan(model="/m", api_servers=2, router_argv=("--inbox-port", "5555"))
