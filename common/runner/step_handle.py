"""A launched step's sampled tokens on their way to the host (the step's one host sync)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from common.runner.output import RunnerOutput


@dataclass
class HostTokens:
    tokens: torch.Tensor  # host tensor (pinned on CUDA) being filled by an async copy
    ready: torch.cuda.Event | None


class StepHandle:
    """A launched step; `result()` waits for its sampled tokens (the step's one host sync)."""

    def __init__(self, num_seqs: int, sample_index: list[int], host: HostTokens | None, logprobs) -> None:
        self.num_seqs, self.sample_index, self.host, self.logprobs = num_seqs, sample_index, host, logprobs

    def result(self) -> RunnerOutput:
        sampled: list[list[int]] = [[] for _ in range(self.num_seqs)]
        logprobs: list[dict | None] = [None] * self.num_seqs
        if self.host is None:
            return RunnerOutput(sampled, logprobs)
        if self.host.ready is not None:
            self.host.ready.synchronize()
        for row, (i, tok) in enumerate(zip(self.sample_index, self.host.tokens.tolist(), strict=True)):
            sampled[i].append(tok)
            if self.logprobs is not None:
                logprobs[i] = self.logprobs[row]
        return RunnerOutput(sampled, logprobs)
