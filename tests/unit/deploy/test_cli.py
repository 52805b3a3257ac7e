"""The `pdserve` console script: pyproject names it, and each command is its module's own CLI."""

from __future__ import annotations

import importlib
import subprocess
import tomllib
from pathlib import Path

import pytest

from deploy import cli
from tests.integration.launcher import script_command

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_pyproject_declares_the_script() -> None:
    module, func = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"][
        "pdserve"
    ].split(":")
    assert getattr(importlib.import_module(module), func) is cli.main


@pytest.mark.parametrize(
    ("command", "own_option"),
    [("serve", "--prefill"), ("chat", "--max-tokens"), ("bench", "--request-rate")],
)
def test_each_command_shows_its_modules_options(command: str, own_option: str) -> None:
    out = subprocess.run(
        [*script_command(), command, "--help"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert own_option in out.stdout
    if command != "bench":  # benchmarks/serving/serving.py names itself
        assert out.stdout.startswith(f"usage: pdserve {command} ")


def test_usage_and_unknown_commands(capsys) -> None:
    assert cli.main(["--help"]) == 0
    shown = capsys.readouterr().out
    assert all(name in shown for name in ("serve", "chat", "bench"))
    for argv in ([], ["launch"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert "usage: pdserve" in err and ("unknown command 'launch'" in err or "required" in err)


def test_serve_arguments_are_the_launchers(capsys) -> None:
    from common.tools.default_model import prepare_default_model

    model = str(prepare_default_model(progress=False))
    with pytest.raises(SystemExit) as exc:  # the launcher's own plan check refuses it
        cli.main(["serve", "--model", model, "--prefill", "1", "--decode", "0"])
    assert exc.value.code == 2 and "could decode" in capsys.readouterr().err


def test_chat_answers_with_the_offline_engine(capsys) -> None:
    assert cli.main(["chat", "--max-tokens", "12", "What is the capital of France?"]) == 0
    assert "Paris" in capsys.readouterr().out


def test_bench_runs_the_client_script_and_returns_its_status(capfd) -> None:
    # The client runs in a child process (no product module imports benchmarks/): its exit status and
    # its own argument errors come back unchanged.
    assert cli.main(["bench", "--base-url", "http://127.0.0.1:9/v1", "--no-such-option"]) == 2
    assert "unrecognized arguments: --no-such-option" in capfd.readouterr().err
