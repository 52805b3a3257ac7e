"""Run a router in-process (FastAPI app over httpx's ASGI transport) with fake workers attached."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from router.config import RouterConfig
from router.server import Router, build_router
from router.tokenizer import ModelTokenizer
from tests.unit.router.fake_workers import FakeWorker, Script, start_workers


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
