"""Build a worker's engine. On CUDA, `gpu_memory_utilization` is read as THIS worker's share of the GPU.

`ModelRunner.num_blocks_for_memory` (common/runner/kv_cache.py) sizes the KV cache as
`util * total - used`, where `used` counts every process on the device. That is right for one engine
per GPU but wrong for workers sharing one: whichever worker sizes its cache second sees the first
one's cache as "used" and gets nothing (or, when they start together, whatever the race leaves). A
worker's runner therefore budgets only against the memory its own process holds (weights,
workspaces): `share * total - own - activation reserve`, which does not depend on what the other
workers are doing at that moment. The launcher keeps the shares of one GPU summing to at most
`--gpu-memory-utilization`.

Everything else (model, speculative proposer, ...) is built by `LLMEngine.from_config`, the one builder.
"""

from __future__ import annotations

import logging

import torch

from common.config import EngineConfig
from common.llm_engine import LLMEngine
from common.runner.kv_cache import activation_reserve
from common.runner.model_runner import ModelRunner

log = logging.getLogger(__name__)


def build_engine(config: EngineConfig) -> LLMEngine:
    if config.tensor_parallel_size != 1:
        raise ValueError("tensor_parallel_size: cluster workers run a single rank for now (use 1)")
    return LLMEngine.from_config(config, runner_cls=SharedGpuRunner)


class SharedGpuRunner(ModelRunner):
    """A ModelRunner whose KV cache is sized from this process's own share of the GPU (on the CPU, or
    with an explicit `num_kvcache_blocks`, it sizes the cache exactly as a ModelRunner does)."""

    def num_blocks_for_memory(self) -> int:
        if self.config.num_kvcache_blocks is not None or not self.platform.is_cuda:
            return super().num_blocks_for_memory()
        self.platform.synchronize()
        total = self.platform.total_memory_bytes()
        own = torch.cuda.memory_reserved(self.device)
        reserve = activation_reserve(self.config, self.model_config)
        blocks = blocks_for_share(
            total, self.config.gpu_memory_utilization, own, reserve, self.kv_bytes_per_block
        )
        log.info(
            "GPU share %.3f of %.1f GiB, %.1f GiB held: %d KV blocks",
            self.config.gpu_memory_utilization,
            total / 2**30,
            own / 2**30,
            blocks,
        )
        return blocks


def blocks_for_share(total: int, share: float, own: int, reserve: int, bytes_per_block: int) -> int:
    """KV blocks that fit in `share` of `total` bytes beside `own` bytes held and `reserve` kept free."""
    blocks = (int(total * share) - own - reserve) // bytes_per_block
    if blocks <= 0:
        raise ValueError(
            f"gpu_memory_utilization: a share of {share} leaves no room for KV blocks "
            f"({own / 2**30:.2f} GiB already held); give this worker a larger share"
        )
    return blocks
