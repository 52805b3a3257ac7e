"""Finding a worker's channel process (`--worker-io process`, common/worker/io_process.py) from its pid."""

from __future__ import annotations


def channel_process(worker_pid: int) -> int:
    """The pid of the worker's channel process (its child running common.worker.io_child)."""
    with open(f"/proc/{worker_pid}/task/{worker_pid}/children") as f:
        for pid in map(int, f.read().split()):
            with open(f"/proc/{pid}/cmdline", "rb") as cmd:
                if b"common.worker.io_child" in cmd.read():
                    return pid
    raise AssertionError(f"worker {worker_pid} runs no channel process")
