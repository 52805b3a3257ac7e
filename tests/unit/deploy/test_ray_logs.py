"""The launcher's Ray log settings (deploy/ray_logs.py): no colour codes when the log is a file, no
folding of one worker's lines into another's, flushed as forwarded; a user's own values win. Checked
against Ray itself, in a fresh interpreter (Ray reads these settings when it is imported)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from deploy.ray_logs import use_readable_ray_logs

REPO_ROOT = Path(__file__).resolve().parents[3]

# What Ray's driver prints for one line of an actor's output, after the launcher's settings.
PRINT_ONE_LINE = """
import io, sys
from deploy.ray_logs import use_readable_ray_logs
use_readable_ray_logs(stdout_is_tty=sys.argv[1] == "tty")
from ray._private import ray_constants, worker
out = io.StringIO()
worker.print_worker_logs({"pid": 7, "actor_name": "ray actor of decode-0", "lines": ["ready"]}, out)
print(repr(out.getvalue()), ray_constants.RAY_DEDUP_LOGS, ray_constants.RAY_FLUSH_DRIVER_LOGS)
"""


def _ray_prints(mode: str) -> str:
    env_keep = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    run = subprocess.run(
        [sys.executable, "-c", PRINT_ONE_LINE, mode],
        cwd=REPO_ROOT,
        env=env_keep | {"PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return run.stdout.strip()


def test_a_file_gets_plain_undeduplicated_flushed_lines() -> None:
    assert _ray_prints("file") == "'(ray actor of decode-0 pid=7) ready\\n' False True"


def test_a_terminal_keeps_rays_colours() -> None:
    assert _ray_prints("tty").startswith("'\\x1b[36m(ray actor of decode-0 pid=7)\\x1b[0m ready")


def test_the_users_own_settings_win() -> None:
    environ = {"RAY_DEDUP_LOGS": "1", "RAY_COLOR_PREFIX": "1"}
    use_readable_ray_logs(stdout_is_tty=False, environ=environ)
    assert environ == {"RAY_DEDUP_LOGS": "1", "RAY_COLOR_PREFIX": "1", "RAY_FLUSH_DRIVER_LOGS": "1"}
