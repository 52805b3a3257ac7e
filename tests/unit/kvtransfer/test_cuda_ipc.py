"""MappedCaches: a dead peer's mapping is closed, a live or busy peer's is kept (real processes; the
CUDA mapping itself is a CPU tensor here, its closing is the GPU test's job)."""

from __future__ import annotations

import subprocess
import sys

import torch

from kvtransfer.cuda_ipc import MappedCaches


def _opener(handle, device):
    return torch.zeros(2, 1, 1, 1, 1, 1)


def _exited_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_mapped_once_per_handle():
    caches = MappedCaches(opener=_opener)
    first, fresh = caches.get({"handle": b"a"}, 1, torch.device("cpu"))
    again, fresh_again = caches.get({"handle": b"a"}, 1, torch.device("cpu"))
    assert fresh and not fresh_again and again is first and len(caches) == 1


def test_dead_peers_mappings_are_closed_live_and_busy_ones_kept():
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        dead, dead_busy = _exited_pid(), _exited_pid()
        caches = MappedCaches(opener=_opener)
        for handle, pid in ((b"live", live.pid), (b"dead", dead), (b"busy", dead_busy)):
            caches.get({"handle": handle}, pid, torch.device("cpu"))
        assert caches.forget_dead(busy=[dead_busy]) == [dead]
        assert len(caches) == 2
        assert caches.forget_dead() == [dead_busy]
        _, fresh = caches.get({"handle": b"live"}, live.pid, torch.device("cpu"))
        assert not fresh and len(caches) == 1
    finally:
        live.kill()
        live.wait()
