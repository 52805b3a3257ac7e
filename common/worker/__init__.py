"""The worker service every cluster role shares (prefill_worker/ and decode_worker/ never import each other).

A worker process is one `WorkerService`: it loads an engine, binds its sockets through `WorkerChannels`
(one I/O thread owns every ZMQ socket: command PULL, router PUSH, events PUB, peer PUSHes; it also sends
the registration every few seconds and heartbeats every ~0.5 s; with `--worker-io process` that
thread runs in a channel process of its own, common/worker/io_process.py), and runs the engine loop in the
caller's thread: take commands from a queue -> poll transfers -> engine.step() -> queue outputs. The
role-specific part (what a request means, how KV moves) is a `WorkerRole`. The wire protocol is the one
written down in docs/protocol.md.
"""

from common.worker.config import WorkerConfig, build_worker_parser, parse_worker_args
from common.worker.role import LoadReport, WorkerContext, WorkerRole

__all__ = [
    "LoadReport",
    "WorkerConfig",
    "WorkerContext",
    "WorkerRole",
    "build_worker_parser",
    "parse_worker_args",
]
