"""Shared fixtures. Also makes the repo root and this folder importable (spawned sender processes inherit
sys.path), whatever directory pytest is started from."""

import sys
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
for _path in (str(_HERE.parents[2]), str(_HERE)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from kv_procs import SPECS, SenderProc  # noqa: E402


@pytest.fixture(scope="session")
def sender_pool():
    """transport -> one sender process (senders for SPECS), started on first use, shared by all tests.
    A small chunk_bytes makes the tcp transport split every request into several data frames."""
    procs: dict[str, SenderProc] = {}

    def get(transport: str) -> SenderProc:
        if transport not in procs:
            procs[transport] = SenderProc(transport, SPECS, chunk_bytes=8192)
        return procs[transport]

    yield get
    for proc in procs.values():
        proc.stop()


@pytest.fixture
def receivers():
    """make(transport, cache, **config) -> a started receiver, closed after the test."""
    from kvtransfer import KVTransferConfig, create_receiver

    made = []

    def make(transport: str, cache, **config_kw):
        r = create_receiver(transport, cache, KVTransferConfig(transport=transport, **config_kw))
        r.start()
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()
