"""A launched step's sampled tokens on their way to the host (the step's one host sync)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from common.runner.output import RunnerOutput


@dataclass
class HostTokens:
    tokens: torch.Tensor  # host tensor (pinned on CUDA) being filled by an async copy
    ready: torch.cuda.Event | None


class StepHandle:
    """A launched step; `result()` waits for its sampled tokens (the step's one host sync).

    `counts[i]`: how many consecutive sampled rows are sequence i's (0, 1, or 1 + its drafts).
    `wait_seconds`: how long `result()` blocked on the device (0 until it is called): the engine sums
    it to tell host time from device time."""

    def __init__(self, counts: list[int], host: HostTokens | None, logprobs) -> None:
        self.counts, self.host, self.logprobs = counts, host, logprobs
        self.wait_seconds = 0.0

    def result(self) -> RunnerOutput:
        if self.host is None:
            return RunnerOutput([[] for _ in self.counts], [None] * len(self.counts))
        if self.host.ready is not None:
            began = time.perf_counter()
            self.host.ready.synchronize()
            self.wait_seconds = time.perf_counter() - began
        tokens = self.host.tokens.tolist()
        if len(tokens) == len(self.counts):  # one row per sequence (plain decode): no regrouping
            sampled = [[t] for t in tokens]
        else:
            sampled, end = [], 0
            for c in self.counts:
                sampled.append(tokens[end : end + c])
                end += c
        return RunnerOutput(sampled, self._last_logprobs())

    def _last_logprobs(self) -> list[dict | None]:
        """Each sequence's last sampled row's logprobs (None where it asked for none)."""
        if self.logprobs is None:
            return [None] * len(self.counts)
        out, end = [], 0
        for c in self.counts:
            end += c
            out.append(self.logprobs[end - 1] if c else None)
        return out
