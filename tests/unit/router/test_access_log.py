"""The launcher's /health polls leave no access line (router/access_log.py); every other request,
a /health from anyone else included, keeps its line. Real uvicorn over a real socket. And the
router's `--disable-uvicorn-access-log` leaves out every line (a real router process)."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from router.access_log import ACCESS_LOGGER, LAUNCHER_AGENT, LauncherProbeMiddleware, quiet_launcher_probes
from tests.unit.router.router_process import REPO_ROOT


@pytest.fixture
def server_url():
    app = FastAPI()
    app.add_api_route("/health", lambda: PlainTextResponse("starting", status_code=503))
    app.add_api_route("/v1/models", lambda: {"data": []})
    app.add_middleware(LauncherProbeMiddleware)
    quiet_launcher_probes()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, log_level="info"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(10)


def test_launcher_polls_leave_no_access_line(server_url, caplog) -> None:
    with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER), httpx.Client(base_url=server_url) as client:
        for _ in range(3):
            assert client.get("/health", headers={"User-Agent": LAUNCHER_AGENT}).status_code == 503
        assert client.get("/health", headers={"User-Agent": "curl/8.5"}).status_code == 503
        assert client.get("/v1/models", headers={"User-Agent": LAUNCHER_AGENT}).status_code == 200
    lines = [r.getMessage() for r in caplog.records if r.name == ACCESS_LOGGER]
    assert len(lines) == 2, lines
    assert '"GET /health HTTP/1.1" 503' in lines[0] and '"GET /v1/models HTTP/1.1" 200' in lines[1]


@pytest.mark.parametrize("flags, expected", [((), 3), (("--disable-uvicorn-access-log",), 0)])
def test_router_process_access_lines_follow_the_flag(model_dir, tmp_path, flags, expected) -> None:
    """`python -m router` at --log-level info writes one access line per request unless told not to."""
    ready = tmp_path / "ready.json"
    cmd = [sys.executable, "-m", "router", "--model", str(model_dir), "--port", "0", "--inbox-port", "0"]
    cmd += ["--ready-file", str(ready), "--log-level", "info", *flags]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "router did not become ready"
            time.sleep(0.05)
        url = json.loads(ready.read_text())["http"]
        with httpx.Client(base_url=url) as client:
            assert client.get("/health").status_code == 503  # no workers yet
            assert client.get("/v1/models").status_code == 200
            assert client.post("/v1/completions", json={"prompt": 5}).status_code == 400
    finally:
        proc.terminate()
        output = proc.communicate(timeout=10)[0]
    access = [line for line in output.splitlines() if ACCESS_LOGGER in line]
    assert len(access) == expected, output
