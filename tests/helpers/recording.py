"""Test-side instrumentation of an engine."""

from __future__ import annotations

import torch


def record_logits(llm) -> list[torch.Tensor]:
    """Wrap the engine's sampler so every step's logits (fp32 copies, in order) land in the returned
    list. The sampler runs on rank 0 only, so with tensor parallelism these are the full logits."""
    seen: list[torch.Tensor] = []
    sample = llm.engine.runner.sampler.__call__

    def recording(logits, batch):
        seen.append(logits.float().clone())
        return sample(logits, batch)

    llm.engine.runner.sampler = recording
    return seen
