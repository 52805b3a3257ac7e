"""`python -m router` as a real process for tests: started with the given flags, stopped after."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]


@contextlib.contextmanager
def router_process(
    model_dir: Path, tmp_path: Path, *flags: str, output: list[str] | None = None
) -> Iterator[dict]:
    """Yields the ready file's contents ({"http", "inbox", "model", ...}) once the router listens;
    `output`, if given, gets the lines the router printed, once it has stopped."""
    ready = tmp_path / "ready.json"
    cmd = [sys.executable, "-m", "router", "--model", str(model_dir), "--port", "0", "--inbox-port", "0"]
    cmd += ["--ready-file", str(ready), "--heartbeat-timeout", "2", "--log-level", "warning", *flags]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "router did not become ready"
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        assert info["http"].startswith("http://127.0.0.1:") and info["inbox"].startswith("tcp://127.0.0.1:")
        yield info
    finally:
        proc.terminate()
        try:
            printed = proc.communicate(timeout=10)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            printed = proc.communicate()[0]
        if output is not None:
            output.extend(printed.splitlines())
