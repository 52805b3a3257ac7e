"""A well-formed WorkerRegister for tests that only need the router to see one arrive (rogue
processes trying to register, authenticated inbox tests): it names no reachable worker."""

from __future__ import annotations

from common.wire.hashing import probe_hash
from common.wire.messages import WorkerRegister


def placeholder_register(worker_id: str, role: str) -> WorkerRegister:
    return WorkerRegister(
        worker_id, role, "127.0.0.1", 1, "tcp://127.0.0.1:9", None, {}, 16, probe_hash(16), 64, 2048, 512, "m"
    )
