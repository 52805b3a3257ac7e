"""The HTTP floor under the router's cost per request: a bare front answering each streamed completion
with SSE chunks and no routing, workers, model objects or metrics (`router_throughput.py --bare-http`).
What the router costs beyond it is its own.

Two floors: `asgi`, a bare ASGI app under the same uvicorn (uvloop, httptools) as the router fronts;
`raw`, an asyncio protocol on uvloop writing the HTTP/1.1 response itself (it reads only what the
benchmark's clients send: requests with a Content-Length body, kept alive), i.e. what is left below
uvicorn. Each request is read whole and parsed as JSON (as the router must); the answer is one write
per token chunk (`max_tokens` of them, one text character each), the last with the usage chunk and
[DONE], as the router sends a stream that takes one token per chunk. With a step (`BARE_STEP_MS` in
the environment, router_throughput.py's `--step-ms`) the chunks are paced as a decode batch paces
them: one shared timer per step wakes every stream, each writes its next chunk, so every write is an
event-loop turn and a socket send of its own (back-to-back writes to one socket cost less: the reader
is woken once for many). `/health` answers as a front with no workers.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from benchmarks.serving.router_fronts import RouterFronts

_SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_JSON = [(b"content-type", b"application/json")]
_HEALTH = b'{"workers":[],"front":null}'
KINDS = ("asgi", "raw")
STEP_ENV = "BARE_STEP_MS"


class _Ticker:
    """One timer per step for every stream: `next()` is the future of the coming tick."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self._tick: asyncio.Future | None = None

    def next(self) -> asyncio.Future:
        if self._tick is None or self._tick.done():
            loop = asyncio.get_running_loop()
            self._tick = loop.create_future()
            loop.call_later(self.step_s, self._tick.set_result, None)
        return self._tick


_ticker = _Ticker(float(os.environ.get(STEP_ENV, "0")) / 1e3)


async def _paced(lines: list[bytes]):
    """(line, more follow) for each line: the first at once, each next one at the next tick (all at
    once without a step)."""
    for i, line in enumerate(lines):
        if i and _ticker.step_s:
            await _ticker.next()
        yield line, i < len(lines) - 1


async def app(scope, receive, send) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["path"] == "/health":
        await send({"type": "http.response.start", "status": 200, "headers": _JSON})
        await send({"type": "http.response.body", "body": _HEALTH})
        return
    lines = _answer(json.loads(await _read_body(receive)))
    await send({"type": "http.response.start", "status": 200, "headers": _SSE})
    async for line, more in _paced(lines):
        await send({"type": "http.response.body", "body": line, "more_body": more})


def _answer(body: dict) -> list[bytes]:
    """The SSE text of a completion of `max_tokens` tokens, one write each; the last write also
    carries the usage chunk and [DONE]. The token chunk is built once: the floor holds no per-token
    formatting (the router's is its own cost)."""
    n = int(body.get("max_tokens") or 1)
    usage = json.dumps({"usage": {"prompt_tokens": 0, "completion_tokens": n}}, separators=(",", ":"))
    last = _chunk("length") + f"data: {usage}\n\ndata: [DONE]\n\n".encode()
    return [_TOKEN_CHUNK] * (n - 1) + [last]


async def _read_body(receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(parts)


def _chunk(finish: str | None) -> bytes:
    payload = {"id": "cmpl-bare", "object": "text_completion", "created": 0, "model": "bare"}
    payload["choices"] = [{"index": 0, "text": "x", "logprobs": None, "finish_reason": finish}]
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


_TOKEN_CHUNK = _chunk(None)


class RawFront(asyncio.Protocol):
    """The `raw` floor: HTTP/1.1 on a kept-alive connection, each response written by hand."""

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.buffer = b""
        self.streams: set[asyncio.Task] = set()  # paced responses in flight (held: tasks are weak)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (request := self._take_request()) is not None:
            first_line, body = request
            if first_line.startswith("GET /health"):
                head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                self.transport.write(head % len(_HEALTH) + _HEALTH)
            else:
                self._stream(_answer(json.loads(body)))

    def _take_request(self) -> tuple[str, bytes] | None:
        """The next whole request (its first line and body) off the buffer; None until one is there."""
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return None
        head = self.buffer[:end].decode("latin-1").split("\r\n")
        fields = (line.partition(":") for line in head[1:])
        length = next((int(v) for k, _, v in fields if k.lower() == "content-length"), 0)
        if len(self.buffer) < end + 4 + length:
            return None  # the rest of the body is still coming
        body, self.buffer = self.buffer[end + 4 : end + 4 + length], self.buffer[end + 4 + length :]
        return head[0], body

    def _stream(self, lines: list[bytes]) -> None:
        self.transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        if not _ticker.step_s:
            for line in lines:
                self.transport.write(_http_chunk(line))
            self.transport.write(b"0\r\n\r\n")
            return
        task = asyncio.ensure_future(self._paced_stream(lines))  # the client's next request comes after
        self.streams.add(task)
        task.add_done_callback(self.streams.discard)

    async def _paced_stream(self, lines: list[bytes]) -> None:
        async for line, more in _paced(lines):
            self.transport.write(_http_chunk(line) + (b"" if more else b"0\r\n\r\n"))


def _http_chunk(line: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(line), line)


async def serve_raw(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(RawFront, "127.0.0.1", port)
    await server.serve_forever()


class BareFront(RouterFronts):
    """One bare front process of `kind` (one front: uvicorn's CLI cannot join another's port), with
    RouterFronts' interface (url, pids, CPU use, pinning, stop)."""

    def __init__(self, kind: str, step_ms: float, *fronts_args) -> None:
        if kind not in KINDS:
            raise ValueError(f"bare front kind must be one of {KINDS}, got {kind!r}")
        if not step_ms >= 0:
            raise ValueError(f"step_ms must be >= 0, got {step_ms!r}")
        super().__init__(*fronts_args)
        self.kind, self.step_ms = kind, step_ms

    def ttft_totals(self) -> None:
        """A bare front keeps no metrics."""
        return None

    def start(self, n: int) -> None:
        if n != 1:
            raise ValueError(f"--bare-http runs one front, got --api-servers {n}")
        super().start(1)

    def _spawn(self, index: int, port: int, several: bool) -> None:
        port = port or _free_port()
        if self.kind == "raw":
            argv = [sys.executable, "-m", "benchmarks.serving.bare_front", str(port)]
        else:
            argv = [sys.executable, "-m", "uvicorn", "benchmarks.serving.bare_front:app", "--port", str(port)]
            argv += ["--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning"]
        root = Path(__file__).resolve().parents[2]  # where `benchmarks.serving.bare_front` imports from
        pin = self._pin(index)
        env = os.environ | {STEP_ENV: str(self.step_ms)}
        self.procs.append(
            subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.DEVNULL, preexec_fn=pin)
        )
        # Not waited for here: the caller's `wait_healthy` polls /health, which this front answers.
        self.ready.append({"http": f"http://127.0.0.1:{port}", "inbox": None})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":  # the raw floor's process: bare_front.py PORT
    import uvloop

    uvloop.run(serve_raw(int(sys.argv[1])))
