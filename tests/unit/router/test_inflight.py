"""The in-flight bound on a real router process: past it, a 429 with Retry-After and an OpenAI error,
sent before the request's body is read; once a request ends, the bound has room again."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from tests.unit.router.fake_workers import Script, start_workers
from tests.unit.router.router_process import router_process


def test_past_the_bound_a_request_gets_429_before_its_body_is_read(
    model_dir: Path, tmp_path: Path, tokenizer
):
    reply = tokenizer.encode(" one two three four", add_special_tokens=False)
    with router_process(model_dir, tmp_path, "--max-running-requests", "1") as info:
        asyncio.run(_overload(info, reply))


@contextlib.asynccontextmanager
async def _serving(
    info: dict, reply: list[int], token_delay: float, timeout: float
) -> AsyncIterator[httpx.AsyncClient]:
    """A scripted prefill and decode worker (the decode one slow per token) on the router at `info`,
    and a client once the router is healthy; the workers stop afterwards."""
    decode = Script(reply=reply, token_delay=token_delay)
    workers = await start_workers(
        info["inbox"], [("p0", "prefill", Script(reply=reply)), ("d0", "decode", decode)]
    )
    try:
        async with httpx.AsyncClient(base_url=info["http"], timeout=timeout) as http:
            await _until_healthy(http)
            yield http
    finally:
        for w in workers:
            await w.stop()


async def _overload(info: dict, reply: list[int]) -> None:
    async with _serving(info, reply, token_delay=0.2, timeout=10) as http:
        body = {"prompt": "x", "max_tokens": len(reply), "stream": True}
        async with http.stream("POST", "/v1/completions", json=body) as first:
            assert first.status_code == 200
            status, headers, error = await _headers_only(info["http"], "/v1/chat/completions")
            assert (status, headers["retry-after"]) == (429, "1")
            assert error["error"]["code"] == "too_many_requests"
            assert error["error"]["type"] == "rate_limit_error"
            assert "x-request-id" in headers
            text = "".join([line async for line in first.aiter_lines()])
            assert text.endswith("data: [DONE]")
        done = await http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert done.status_code == 200
        metrics = (await http.get("/metrics")).text
        assert 'pdserve_requests_total{status="rejected"} 1\n' in metrics


async def _headers_only(url: str, path: str) -> tuple[int, dict[str, str], dict]:
    """Send a request's headers announcing a body, and never the body: only an answer that does not
    wait for the body comes back (else this times out)."""
    where = urlsplit(url)
    reader, writer = await asyncio.open_connection(where.hostname, where.port)
    head = f"POST {path} HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
    writer.write(f"{head}Content-Length: 100000\r\n\r\n".encode())
    await writer.drain()
    try:
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
        lines = raw.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), timeout=5)
    finally:
        writer.close()
    return int(lines[0].split()[1]), headers, json.loads(body)


async def _until_healthy(http: httpx.AsyncClient) -> None:
    deadline = time.monotonic() + 10
    while (await http.get("/health")).status_code != 200:
        assert time.monotonic() < deadline, "router never became healthy"
        await asyncio.sleep(0.05)


def test_with_an_admission_wait_a_request_past_the_bound_is_served_once_a_place_frees(
    model_dir: Path, tmp_path: Path, tokenizer
):
    reply = tokenizer.encode(" one two three", add_special_tokens=False)
    args = ("--max-running-requests", "1", "--admission-wait", "10")
    with router_process(model_dir, tmp_path, *args) as info:
        asyncio.run(_waited(info, reply))


async def _waited(info: dict, reply: list[int]) -> None:
    async with _serving(info, reply, token_delay=0.3, timeout=20) as http:
        body = {"prompt": "x", "max_tokens": len(reply)}
        first = asyncio.create_task(http.post("/v1/completions", json=body))
        await asyncio.sleep(0.2)  # the first holds the only place
        began = time.monotonic()
        second = await http.post("/v1/completions", json=body)
        assert second.status_code == 200, second.text  # held, not shed
        assert time.monotonic() - began > 0.2  # it waited for the first to end
        assert (await first).status_code == 200
        assert 'pdserve_requests_total{status="rejected"}' not in (await http.get("/metrics")).text
