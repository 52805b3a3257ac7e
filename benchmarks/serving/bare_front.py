"""The HTTP floor under the router's cost per request: a bare ASGI app under the same uvicorn as the
router fronts, answering each streamed completion with SSE chunks and no routing, workers, model
objects or metrics (`router_throughput.py --bare-http`). What the router costs beyond it is its own.

Each request is read whole and parsed as JSON (as the router must); the answer is one write per token
chunk (`max_tokens` of them, one text character each), the last with the usage chunk and [DONE], as the
router sends a stream that takes one token per chunk. `/health` answers as a front with no workers.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from benchmarks.serving.router_fronts import RouterFronts

_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_JSON = [(b"content-type", b"application/json")]


async def app(scope, receive, send) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["path"] == "/health":
        await send({"type": "http.response.start", "status": 200, "headers": _JSON})
        await send({"type": "http.response.body", "body": b'{"workers":[],"front":null}'})
        return
    body = json.loads(await _read_body(receive))
    n = int(body.get("max_tokens") or 1)
    await send({"type": "http.response.start", "status": 200, "headers": _SSE})
    for i in range(n):
        line = _chunk(i, "length" if i == n - 1 else None)
        if i < n - 1:
            await send({"type": "http.response.body", "body": line, "more_body": True})
    usage = json.dumps({"usage": {"prompt_tokens": 0, "completion_tokens": n}}, separators=(",", ":"))
    await send({"type": "http.response.body", "body": line + f"data: {usage}\n\ndata: [DONE]\n\n".encode()})


async def _read_body(receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(parts)


def _chunk(index: int, finish: str | None) -> bytes:
    payload = {"id": "cmpl-bare", "object": "text_completion", "created": 0, "model": "bare"}
    payload["choices"] = [{"index": 0, "text": "x", "logprobs": None, "finish_reason": finish}]
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


class BareFront(RouterFronts):
    """One uvicorn process serving `app` (one front: uvicorn's CLI cannot join another's port), with
    RouterFronts' interface (url, pids, CPU use, pinning, stop)."""

    def start(self, n: int) -> None:
        if n != 1:
            raise ValueError(f"--bare-http runs one front, got --api-servers {n}")
        super().start(1)

    def _spawn(self, index: int, port: int, several: bool) -> None:
        port = port or _free_port()
        argv = [sys.executable, "-m", "uvicorn", "benchmarks.serving.bare_front:app", "--port", str(port)]
        argv += ["--app-dir", str(Path(__file__).resolve().parents[2]), "--loop", "uvloop"]
        argv += ["--http", "httptools", "--no-access-log", "--log-level", "warning"]
        self.procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, preexec_fn=self._pin(index)))
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while not _answers(f"{url}/health"):
            if self.procs[-1].poll() is not None or time.time() > deadline:
                raise RuntimeError("the bare HTTP front did not start")
            time.sleep(0.05)
        self.ready.append({"http": url, "inbox": None})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except OSError:
        return False
