"""A self-pipe that wakes a ZMQ poller from another thread (torch-free; the worker channels and the
kvtransfer I/O threads both use it)."""

from __future__ import annotations

import contextlib
import os


class Waker:
    """Register `fd` with a `zmq.Poller`; `wake()` from any thread makes the poll return at once.

    ZMQ sockets must stay on their I/O thread, so other threads (the engine's) cannot poke them; a pipe
    write is thread-safe and cheap."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)

    @property
    def fd(self) -> int:
        return self._r

    def wake(self) -> None:
        # A full pipe means a wake-up is already pending; a closed one means we are shutting down.
        with contextlib.suppress(OSError):
            os.write(self._w, b"x")

    def drain(self) -> None:
        with contextlib.suppress(OSError):  # BlockingIOError: the pipe is empty
            while os.read(self._r, 4096):
                pass

    def close(self) -> None:
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):
                os.close(fd)
