"""The CUDA allocator's out-of-memory error raised from a model's forward, for the CPU tests of the
engines' recovery (common/runner/memory_retry.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch


def forward_running_out_of_memory(
    monkeypatch, model, times: int, check: Callable[[], None] | None = None
) -> list[int]:
    """The next `times` calls of `model.forward` raise the allocator's error (`check` runs first, e.g.
    to assert which step it is); returns the count raised so far, as a one-item list."""
    real, raised = model.forward, [0]

    def failing(*args, **kwargs):
        if raised[0] < times:
            if check is not None:
                check()
            raised[0] += 1
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 342.00 MiB")
        return real(*args, **kwargs)

    monkeypatch.setattr(model, "forward", failing)
    return raised
