"""Run a router in-process (FastAPI app over httpx's ASGI transport) with fake workers attached."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from router.config import RouterConfig
from router.server import Router, build_router
from router.tokenizer import ModelTokenizer
from tests.unit.router.fake_workers import FakeWorker, Script, start_workers

# What the scripted workers answer by default: multi-byte characters included, then EOS.
REPLY_TEXT = " Hello 😀 世界! The end."
EOS = 2


def scripted_reply(tokenizer: ModelTokenizer) -> list[int]:
    """REPLY_TEXT's token ids and EOS: a scripted worker's default reply."""
    return tokenizer.encode(REPLY_TEXT, add_special_tokens=False) + [EOS]


def pd_specs(tokenizer: ModelTokenizer, prefill: Script | None = None, decode: Script | None = None) -> list:
    """One prefill and one decode worker (prefill-0, decode-0), each replying `scripted_reply` unless
    its script says otherwise."""
    reply = scripted_reply(tokenizer)
    prefill = prefill or Script()
    decode = decode or Script()
    prefill.reply = prefill.reply or reply
    decode.reply = decode.reply or reply
    return [("prefill-0", "prefill", prefill), ("decode-0", "decode", decode)]


@dataclass
class Harness:
    router: Router
    client: httpx.AsyncClient
    workers: list[FakeWorker]

    def worker(self, worker_id: str) -> FakeWorker:
        return next(w for w in self.workers if w.worker_id == worker_id)


async def wait_for(predicate: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def cluster_ready(router: Router, worker_ids: list[str]) -> bool:
    """Every worker registered and live, and the index view of every worker with events synced."""
    for worker_id in worker_ids:
        info = router.registry.get(worker_id)
        if info is None or info.heartbeat is None:
            return False
        if info.reg.events_addr is not None and router.index.awaiting_snapshot(worker_id):
            return False
    return True


@contextlib.asynccontextmanager
async def running_router(
    model_dir: Path,
    tokenizer: ModelTokenizer,
    specs: list[tuple[str, str, Script]],
    **overrides,
) -> AsyncIterator[Harness]:
    config = RouterConfig(model=str(model_dir), **{"heartbeat_timeout": 1.0, **overrides})
    app, router = build_router(config, tokenizer)
    await router.start()
    assert router.inbox_addr is not None
    workers = await start_workers(router.inbox_addr, specs)
    transport = httpx.ASGITransport(app=app)
    client = httpx.AsyncClient(transport=transport, base_url="http://router", timeout=10.0)
    try:
        await wait_for(lambda: cluster_ready(router, [w.worker_id for w in workers]), what="workers")
        yield Harness(router, client, workers)
    finally:
        await client.aclose()
        for w in workers:
            await w.stop()
        await router.stop()


def run_router(
    model_dir: Path, tokenizer: ModelTokenizer, specs: list, fn: Callable[[Harness], Awaitable], **overrides
):
    """`fn(harness)` against a running router with `specs`' workers, in a fresh event loop; its result."""

    async def main():
        async with running_router(model_dir, tokenizer, specs, **overrides) as h:
            return await fn(h)

    return asyncio.run(main())


def sse_events(text: str) -> list:
    """The JSON payload of each `data:` event of a chat/completions stream, "[DONE]" as itself."""
    events = []
    for block in text.split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            payload = block[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events
