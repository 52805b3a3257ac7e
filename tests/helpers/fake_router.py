"""Helpers for tests of a worker's channels over real ZMQ sockets against a fake router inbox (the
`router_inbox` fixture of tests/unit/common/worker/conftest.py: a PULL socket the worker pushes to)."""

from __future__ import annotations

import time

import zmq

from common.wire.hashing import probe_hash
from common.wire.messages import WorkerRegister, decode


def receive(sock: zmq.Socket, kind: type, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sock.poll(100):
            msg = decode(sock.recv())
            if isinstance(msg, kind):
                return msg
    raise AssertionError(f"no {kind.__name__} arrived")


def registration(command_addr: str, events_addr: str | None) -> WorkerRegister:
    return WorkerRegister(
        "p0", "prefill", "127.0.0.1", 1, command_addr, events_addr, {}, 16, probe_hash(16), 8, 64, 64, "m"
    )
