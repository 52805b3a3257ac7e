"""The CUDA allocator's out-of-memory error raised from a model's forward (or a chunk's launch in
parts), for the CPU tests of the engines' recovery (common/runner/memory_retry.py)."""

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
            raise _allocator_error()
        return real(*args, **kwargs)

    monkeypatch.setattr(model, "forward", failing)
    return raised


def parts_running_out_of_memory(monkeypatch, model, times: int, at_part: int = 1) -> list[int]:
    """The next `times` chunk launches in parts (`model.forward_in_parts`) raise the allocator's error in
    their part `at_part` (0 or 1; the second, as an eager chunk on an 80-GB H100 did); returns the count
    raised so far, as a one-item list."""
    real, raised = model.forward_in_parts, [0]

    def failing(*args):
        parts = real(*args)
        if at_part:
            yield next(parts)
        if raised[0] < times:
            raised[0] += 1
            raise _allocator_error()
        yield from parts

    monkeypatch.setattr(model, "forward_in_parts", lambda *a: failing(*a))
    return raised


def _allocator_error() -> torch.OutOfMemoryError:
    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 342.00 MiB")
