"""Small device helpers: a copy stream that is a no-op on CPU, events, and host staging buffers."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class CopyStream:
    """A dedicated CUDA stream for transfer copies (so they overlap the engine's compute); on CPU every
    method is a no-op. Create it in `start()`: making a CUDA stream initializes the device."""

    def __init__(self, device: torch.device) -> None:
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    @contextlib.contextmanager
    def use(self) -> Iterator[None]:
        if self._stream is None:
            yield
        else:
            with torch.cuda.stream(self._stream):
                yield

    def wait(self, event: torch.cuda.Event | None) -> None:
        """Make copies queued on this stream from now on wait for `event` (work the engine queued
        earlier); a no-op on CPU, where there is no event."""
        if self._stream is not None and event is not None:
            self._stream.wait_event(event)

    def synchronize(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()


def record_event(device: torch.device) -> torch.cuda.Event | None:
    """An event on the calling thread's current stream (the engine's), so the transfer thread can wait
    for kernels the engine queued on those blocks before it reads or overwrites them. None on CPU."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


def wait_event(event: torch.cuda.Event | None) -> None:
    if event is not None:
        event.synchronize()


def host_buffer(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype, pinned: bool) -> torch.Tensor:
    """Host staging memory: pinned (torch caches pinned blocks, so this is cheap after warm-up) when the
    other end of the copy is a GPU, plain otherwise."""
    return torch.empty(shape, dtype=dtype, pin_memory=pinned)
