"""The launcher's /health polls leave no access line (router/access_log.py); every other request,
a /health from anyone else included, keeps its line. Real uvicorn over a real socket. And the
router's `--disable-uvicorn-access-log` leaves out every line (a real router process)."""

from __future__ import annotations

import logging
import socket
import threading
import time

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from router.access_log import ACCESS_LOGGER, LAUNCHER_AGENT, LauncherProbeMiddleware, quiet_launcher_probes
from tests.unit.router.router_process import router_process


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
    output: list[str] = []
    flags = ("--log-level", "info", *flags)
    with (
        router_process(model_dir, tmp_path, *flags, output=output) as info,
        httpx.Client(base_url=info["http"]) as client,
    ):
        assert client.get("/health").status_code == 503  # no workers yet
        assert client.get("/v1/models").status_code == 200
        assert client.post("/v1/completions", json={"prompt": 5}).status_code == 400
    access = [line for line in output if ACCESS_LOGGER in line]
    assert len(access) == expected, "\n".join(output)
