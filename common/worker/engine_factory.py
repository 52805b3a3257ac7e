"""Build a worker's engine. On CUDA, `gpu_memory_utilization` is read as THIS worker's share of the GPU.

`ModelRunner.num_blocks_for_memory` sizes the KV cache as `util * total - used`, where `used` counts
every process on the device. That is right for one engine per GPU but wrong for workers sharing one:
the second worker to start would see the first one's cache as "used" and get nothing. So the factory
adds the memory other processes hold to the share before the runner sizes its cache. If another
worker allocates in between, `used` only grows and this worker takes less, never more.
"""

from __future__ import annotations

import logging

import torch

from common.config import EngineConfig
from common.device import DevicePlatform, resolve_platform
from common.llm_engine import LLMEngine, resolve_max_model_len
from common.model_config import ModelConfig
from common.runner.model_runner import ModelRunner

log = logging.getLogger(__name__)


def build_engine(config: EngineConfig) -> LLMEngine:
    if config.tensor_parallel_size != 1:
        raise ValueError("tensor_parallel_size: cluster workers run a single rank for now (use 1)")
    platform = resolve_platform(config.device)
    if not platform.is_cuda or config.num_kvcache_blocks is not None:
        return LLMEngine.from_config(config)
    model_config = ModelConfig.from_dir(config.model)
    runner = ModelRunner(config, model_config, platform, resolve_max_model_len(config, model_config))
    runner.load_model()
    device_wide = device_wide_utilization(config.gpu_memory_utilization, platform)
    runner.config = config.with_overrides(gpu_memory_utilization=device_wide)
    runner.allocate_kv_cache()
    if not config.enforce_eager:
        runner.capture_graphs()
    return LLMEngine(config, model_config, runner)


def device_wide_utilization(share: float, platform: DevicePlatform) -> float:
    """The device-wide fraction that leaves this process `share` of the GPU beside other processes."""
    platform.synchronize()
    total = platform.total_memory_bytes()
    others = total - platform.free_memory_bytes() - torch.cuda.memory_reserved(platform.torch_device)
    fraction = min(1.0, share + max(others, 0) / total)
    log.info("GPU share %.3f + %.3f held by others -> utilization %.3f", share, others / total, fraction)
    return fraction
