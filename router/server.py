"""Assemble the router and serve it with uvicorn.

`build_router(config)` wires every part together (in-process use: tests, launchers) and returns the
ASGI app plus the `Router` holding the parts; the app's lifespan binds the ZMQ inbox. `serve`
binds the HTTP socket itself so `--port 0` works, and once both sockets listen it writes the ready
file `{"http": url, "inbox": addr}` (atomically) and prints the same JSON on one stdout line that
starts with READY_PREFIX.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import NamedTuple

import uvicorn
from starlette.types import ASGIApp

from common.net.addresses import bracket
from common.wire.generation_config import GenerationDefaults, load_generation_defaults
from router.access_log import quiet_launcher_probes
from router.app import create_app
from router.cluster_client import ClusterClient
from router.config import RouterConfig
from router.front_metrics import FrontMetrics
from router.front_slots import FrontSlots
from router.inflight import InflightBound
from router.kv_probes import KVProbes
from router.live_rates import LiveRates
from router.policy import RoutingPolicy, make_policy
from router.prefix_index import PrefixIndex
from router.request_builder import RequestBuilder
from router.request_lifecycle import RequestLifecycle
from router.route_planner import RoutePlanner
from router.router_metrics import RouterMetrics
from router.tokenizer import ModelTokenizer
from router.worker_registry import WorkerRegistry

log = logging.getLogger(__name__)
READY_PREFIX = "PDSERVE_ROUTER_READY "


@dataclass
class Router:
    """Every long-lived part of one router."""

    config: RouterConfig
    tokenizer: ModelTokenizer
    registry: WorkerRegistry
    index: PrefixIndex
    policy: RoutingPolicy
    metrics: RouterMetrics
    cluster: ClusterClient
    lifecycle: RequestLifecycle
    builder: RequestBuilder
    inflight: InflightBound
    front_metrics: FrontMetrics | None = None  # with several fronts (--fronts-dir): /metrics sums them

    @property
    def running(self) -> int:
        """Generation requests in flight on this front (admitted, not yet answered in full)."""
        return self.inflight.count

    async def start(self) -> str:
        """Map the fronts' shared state (if any) and bind the inbox; returns the inbox's address (what
        workers must push to)."""
        self.inflight.open()
        if self.front_metrics is not None:
            self.front_metrics.start()
        return await self.cluster.start()

    async def stop(self) -> None:
        try:
            await self.cluster.stop()
        finally:
            if self.front_metrics is not None:
                await self.front_metrics.stop()
            self.inflight.close()

    def exposition(self) -> str:
        """/metrics: summed over the fronts when they share a directory, else this router's own (labelled
        `front="i"` when it is one of several)."""
        if self.front_metrics is not None:
            return self.front_metrics.render()
        return self.metrics.registry.render(self.config.front)

    @property
    def inbox_addr(self) -> str | None:
        return self.cluster.inbox_addr


class RouterHandles(NamedTuple):
    app: ASGIApp
    router: Router


def build_router(config: RouterConfig, tokenizer: ModelTokenizer | None = None) -> RouterHandles:
    """Wire the router's parts; reads the tokenizer files from `config.model` unless one is given,
    and the requests' sampling defaults as `config.generation_config` says."""
    tokenizer = tokenizer or ModelTokenizer.from_dir(config.model)
    defaults = load_generation_defaults(config.generation_config, config.model)
    _log_defaults(config.generation_config, defaults)
    registry = WorkerRegistry(config.heartbeat_timeout, config.block_size, config.disagg)
    index = PrefixIndex()
    policy = make_policy(config.routing, config.balance_threshold_tokens)
    metrics = RouterMetrics()
    rates = LiveRates()
    probes = KVProbes(config.kv_probe_min_gbps, config.kv_probe_bytes)
    cluster = ClusterClient(config, registry, index, rates=rates, probes=probes)
    planner = RoutePlanner(registry, index, policy, rates, config.disagg_stall_weight, probes)
    lifecycle = RequestLifecycle(config, tokenizer, cluster, registry, planner, metrics)
    router = Router(
        config,
        tokenizer,
        registry,
        index,
        policy,
        metrics,
        cluster,
        lifecycle,
        RequestBuilder(tokenizer, defaults),
        InflightBound(config.max_running_requests, metrics, _shared_slots(config)),
        _front_metrics(config, metrics),
    )
    return RouterHandles(create_app(router), router)


def _shared_slots(config: RouterConfig) -> FrontSlots | None:
    if config.fronts_dir is None or config.front is None:
        return None
    return FrontSlots(config.fronts_dir, config.front)


def _front_metrics(config: RouterConfig, metrics: RouterMetrics) -> FrontMetrics | None:
    if config.fronts_dir is None or config.front is None:
        return None
    return FrontMetrics(config.fronts_dir, config.front, metrics)


def _log_defaults(choice: str, defaults: GenerationDefaults) -> None:
    # Said once at start-up (as vLLM does): a request's sampling then differs from the engine's defaults.
    if defaults.as_dict():
        log.info("requests' sampling defaults from generation config %r: %s", choice, defaults.as_dict())


async def serve(config: RouterConfig, log_level: str = "info") -> None:
    """Run until cancelled or interrupted (uvicorn handles SIGINT/SIGTERM)."""
    app, router = build_router(config)
    sock = _bind_http(config.host, config.port, config.reuse_port)
    quiet_launcher_probes()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level=log_level,
            lifespan="on",
            timeout_keep_alive=30,
            log_config=None,
            access_log=not config.disable_uvicorn_access_log,
        )
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()  # startup failed: raise its error
            return
        await asyncio.sleep(0.02)
    _announce_ready(config, _http_url(config.host, sock.getsockname()[1]), router.inbox_addr or "")
    await task


def _bind_http(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:  # several fronts listen on this port; the kernel spreads the connections
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    sock.set_inheritable(True)
    return sock


def _http_url(host: str, port: int) -> str:
    """A URL a local client can use: wildcard binds are reached through loopback."""
    shown = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"http://{bracket(shown)}:{port}"


def _announce_ready(config: RouterConfig, http_url: str, inbox: str) -> None:
    info = {
        "http": http_url,
        "inbox": inbox,
        "model": config.model_name,
        "pid": os.getpid(),
        "time": time.time(),
    }
    text = json.dumps(info)
    if config.ready_file:
        tmp = f"{config.ready_file}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, config.ready_file)  # readers never see a half-written file
    print(READY_PREFIX + text, flush=True)
    log.info("router ready: %s", text)
    sys.stdout.flush()
