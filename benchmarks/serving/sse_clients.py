"""The client processes of benchmarks/serving/router_throughput.py: keep streaming completions in flight
(closed loop), or send them at a fixed mean rate (open loop, Poisson arrivals: `rate`).

A client does not parse every chunk: it counts SSE events and reads the token count from the final
usage chunk, so one client process carries far more than one router front can send. It records each
request's time to its first SSE event (TTFT, ms).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from dataclasses import asdict, dataclass, field


@dataclass
class ClientResult:
    tokens: int = 0
    chunks: int = 0
    requests: int = 0
    errors: int = 0
    last_done: float = 0.0
    first_error: str = ""
    ttft_ms: list[float] = field(default_factory=list)


def run_clients(
    url: str,
    concurrency: int,
    body: dict,
    start_at: float,
    end_at: float,
    out,
    cpus: set[int] | None,
    rate: float | None = None,
) -> None:  # a child process
    """`concurrency` streams back to back; with `rate` (requests/s), open-loop arrivals instead."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    if rate:
        result = asyncio.run(_open_loop(url, rate, body, start_at, end_at))
    else:
        result = asyncio.run(_clients(url, concurrency, body, start_at, end_at))
    out.put(asdict(result))


async def _open_loop(url: str, rate: float, body: dict, start_at: float, end_at: float) -> ClientResult:
    import aiohttp

    result, tasks = ClientResult(), set()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as s:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        due = time.time()
        while due < end_at:  # arrival times fixed in advance: a slow reply never delays the next send
            await asyncio.sleep(max(0.0, due - time.time()))
            task = asyncio.create_task(_one(s, url, body, result))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            due += random.expovariate(rate)
        await asyncio.gather(*tasks)
    return result


async def _clients(url: str, concurrency: int, body: dict, start_at: float, end_at: float) -> ClientResult:
    import aiohttp

    result = ClientResult()
    # No connection limit: every stream has its own connection, and with several fronts on one port
    # (SO_REUSEPORT) the kernel spreads those connections over the fronts.
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as s:
        await asyncio.sleep(max(0.0, start_at - time.time()))

        async def loop() -> None:
            while time.time() < end_at:
                await _one(s, url, body, result)

        await asyncio.gather(*(loop() for _ in range(concurrency)))
    return result


async def _one(session, url: str, body: dict, result: ClientResult) -> None:
    chunks, tail, sent, first = 0, b"", time.perf_counter(), 0.0
    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
            async for data in resp.content.iter_any():
                chunks += data.count(b"data: ")
                if not first and chunks:
                    first = time.perf_counter()
                tail = (tail + data)[-4096:]
    except Exception as e:  # counted, not fatal: the run goes on
        result.errors += 1
        result.first_error = result.first_error or f"{type(e).__name__}: {e}"[:300]
        return
    usage_at = tail.rfind(b'"usage":{')
    if usage_at < 0:
        result.errors += 1
        result.first_error = result.first_error or "no usage chunk"
        return
    usage = json.loads(tail[tail.rfind(b"data: ", 0, usage_at) + 6 :].split(b"\n", 1)[0])["usage"]
    result.tokens += usage["completion_tokens"]
    result.chunks += chunks - 2  # minus the usage chunk and [DONE]
    result.requests += 1
    result.ttft_ms.append(1e3 * (first - sent))
    result.last_done = time.time()
