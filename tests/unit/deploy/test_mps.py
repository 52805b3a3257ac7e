"""The launcher's private MPS daemon (deploy/mps.py), against a stand-in for CUDA's control program.

MPS needs an NVIDIA GPU, which this machine lacks, so a small program named like the real one stands
in: it records each call (arguments, stdin, the two MPS directories of its environment), as the real
one it starts with `-d` and stops on `quit` read from stdin, and it fails when told to. On a GPU host
the real program runs in `tests/integration/test_cluster_gpu.py` (setup `ipc-mps`).
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from common.tools.default_model import prepare_default_model
from deploy.launch_args import parse_args
from deploy.mps import CONTROL, LOG_ENV, PIPE_ENV, MPSDaemon
from deploy.plan import LaunchPlan

STAND_IN = f"""#!{sys.executable}
import json, os, sys
record = {{"args": sys.argv[1:], "stdin": "" if "-d" in sys.argv else sys.stdin.read(),
          "pipe": os.environ.get("{PIPE_ENV}"), "log": os.environ.get("{LOG_ENV}")}}
with open(os.environ["MPS_STAND_IN_CALLS"], "a") as f:
    f.write(json.dumps(record) + "\\n")
if os.environ.get("MPS_STAND_IN_FAIL"):
    print("An instance of this daemon is already running", file=sys.stderr)
    sys.exit(1)
"""


@pytest.fixture
def control(tmp_path, monkeypatch) -> Path:
    """Put the stand-in first on PATH; returns the file its calls are recorded in."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program = bin_dir / CONTROL
    program.write_text(STAND_IN)
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("MPS_STAND_IN_CALLS", str(calls))
    return calls


def _calls(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_daemon_runs_in_its_own_directories_and_quits_once(control, tmp_path) -> None:
    daemon = MPSDaemon(tmp_path / "mps")
    daemon.start()
    env = daemon.worker_env()
    assert env == {PIPE_ENV: str(tmp_path / "mps" / "pipe"), LOG_ENV: str(tmp_path / "mps" / "log")}
    assert Path(env[PIPE_ENV]).is_dir() and Path(env[LOG_ENV]).is_dir()
    daemon.stop()
    daemon.stop()  # idempotent: one quit
    calls = _calls(control)
    assert [c["args"] for c in calls] == [["-d"], []]
    assert calls[1]["stdin"] == "quit\n"
    assert all((c["pipe"], c["log"]) == (env[PIPE_ENV], env[LOG_ENV]) for c in calls)


def test_a_daemon_that_cannot_start_is_a_clear_error(control, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MPS_STAND_IN_FAIL", "1")
    daemon = MPSDaemon(tmp_path / "mps")
    with pytest.raises(RuntimeError, match="did not start .*already running"):
        daemon.start()
    daemon.stop()  # nothing started: nothing to quit
    assert [c["args"] for c in _calls(control)] == [["-d"]]


def test_a_missing_control_program_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(RuntimeError, match="needs nvidia-cuda-mps-stand-in-missing on PATH"):
        MPSDaemon(tmp_path, control="nvidia-cuda-mps-stand-in-missing").start()


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"backend": "ray"}, "--backend local"),
        ({"backend": "local", "engine": {"device": "cpu"}}, "--device cpu"),
    ],
)
def test_plan_refuses_mps_where_it_cannot_apply(kwargs, field) -> None:
    with pytest.raises(ValueError, match=f"--mps.*{field}"):
        LaunchPlan("/m", mps=True, **kwargs)


def test_launch_flag(capsys) -> None:
    model = str(prepare_default_model(progress=False))
    assert parse_args(["--model", model, "--backend", "local", "--mps"]).mps
    assert not parse_args(["--model", model, "--backend", "local"]).mps
    with pytest.raises(SystemExit):
        parse_args(["--model", model, "--backend", "ray", "--mps"])
    assert "--mps runs the workers under this host's MPS daemon" in capsys.readouterr().err
