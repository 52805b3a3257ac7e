"""Sampled tokens on their way to the host: pinned buffers filled by async copies (CUDA)."""

from __future__ import annotations

import torch

from common.runner.step_handle import HostTokens


class HostStaging:
    """Two pinned buffers used in turn, each with the event of the copy that last filled it, so a
    launch never waits for the copy it just queued, only (rarely) for the one two launches back.

    One staging per stream that launches steps: a buffer's event is recorded on the stream current at
    `stage`, and a buffer shared between two streams' steps would make one wait for the other."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._buffers: list[torch.Tensor] | None = None  # made at first use (no device work here)
        self._events: list[torch.cuda.Event] = []
        self._turn = 0

    def stage(self, tokens: torch.Tensor) -> HostTokens:
        if tokens.device.type != "cuda":
            return HostTokens(tokens, None)
        if self._buffers is None:
            self._buffers = [torch.empty(self.size, dtype=torch.int64, pin_memory=True) for _ in range(2)]
            self._events = [torch.cuda.Event() for _ in range(2)]
        turn = self._turn
        self._turn ^= 1
        self._events[turn].synchronize()  # its previous reader (two launches ago) is done
        host = self._buffers[turn][: tokens.shape[0]]
        host.copy_(tokens, non_blocking=True)
        self._events[turn].record()
        return HostTokens(host, self._events[turn])
