"""How many router fronts the launcher starts when `--api-servers` is not given, what it checks, and
what each front is told (its index, the shared port and directory)."""

from __future__ import annotations

import pytest

from common.tools.default_model import prepare_default_model
from deploy import launch_args
from deploy.fronts import Fronts, default_api_servers
from deploy.launch_args import parse_args
from deploy.plan import LaunchPlan


def test_one_front_per_four_cores_up_to_four_unless_asked(capsys, monkeypatch) -> None:
    assert [default_api_servers(c) for c in (1, 2, 4, 7, 8, 16, 64)] == [1, 1, 1, 1, 2, 4, 4]
    with pytest.raises(ValueError, match="cores"):
        default_api_servers(0)
    model = str(prepare_default_model(progress=False))
    monkeypatch.setattr(launch_args, "host_cores", lambda: 16)
    assert parse_args(["--model", model]).api_servers == 4
    assert parse_args(["--model", model, "--inbox-port", "0"]).api_servers == 1  # one fixed inbox
    monkeypatch.setattr(launch_args, "host_cores", lambda: 2)
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


def test_several_fronts_share_a_directory_one_front_has_none(tmp_path) -> None:
    two = Fronts(LaunchPlan(model="/m", api_servers=2), str(tmp_path), {})
    argv = two.argv(1, 8000, None)
    assert argv[argv.index("--front") + 1] == "1" and "--reuse-port" in argv
    assert argv[argv.index("--fronts-dir") + 1] == str(two.shared_dir) == str(tmp_path / "fronts")
    one = Fronts(LaunchPlan(model="/m"), str(tmp_path), {})
    argv = one.argv(0, 8000, None)
    assert one.shared_dir is None and not {"--front", "--fronts-dir", "--reuse-port"} & set(argv)
