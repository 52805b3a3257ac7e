"""The paged KV cache's size and allocation: bytes per block, how many blocks fit in the memory
budget, and the tensor `[2, num_layers, num_blocks, block_size, num_kv_heads, head_dim]` whose
per-layer views the attention layers write into. With `kv_cache_dtype="fp8"` each block carries its
scales in extra rows (`common/attention/kv_fp8.py`), which the bytes per block count.

The ModelRunner calls these at start-up (its `num_blocks_for_memory` is the hook a worker's runner
overrides to size from its own share of a GPU: common/worker/engine_factory.py).
"""

from __future__ import annotations

import logging
import math

import torch

from common.attention import kv_fp8
from common.config import EngineConfig
from common.device import DevicePlatform
from common.layers.attention import Attention
from common.model_config import ModelConfig

logger = logging.getLogger(__name__)


def kv_cache_shape(
    model_config: ModelConfig, config: EngineConfig, num_blocks: int, dtype: torch.dtype
) -> tuple[int, ...]:
    """This rank's cache tensor shape (its KV heads; fp8 blocks with their scale rows)."""
    return kv_fp8.cache_shape(
        model_config.num_hidden_layers,
        num_blocks,
        config.kvcache_block_size,
        model_config.num_key_value_heads // config.tensor_parallel_size,
        model_config.head_dim,
        dtype,
    )


def kv_bytes_per_block(model_config: ModelConfig, config: EngineConfig, dtype: torch.dtype) -> int:
    """Bytes one block takes on this rank (keys and values of every layer, this rank's KV heads, and
    with fp8 their scales); `dtype` is the cache's dtype."""
    shape = kv_cache_shape(model_config, config, 1, dtype)
    return math.prod(shape) * torch.empty(0, dtype=dtype).element_size()


def blocks_for_memory(
    config: EngineConfig, model_config: ModelConfig, platform: DevicePlatform, bytes_per_block: int
) -> int:
    """Blocks that fit: `num_kvcache_blocks` when given; on CUDA, `gpu_memory_utilization` of the
    device less what is used and the activation reserve; on the CPU, `cpu_kvcache_gb`."""
    if config.num_kvcache_blocks is not None:
        return config.num_kvcache_blocks
    if platform.is_cuda:
        platform.synchronize()
        total = platform.total_memory_bytes()
        used = total - platform.free_memory_bytes()
        budget = int(total * config.gpu_memory_utilization) - used - activation_reserve(config, model_config)
    else:
        budget = int(config.cpu_kvcache_gb * (1 << 30))
    blocks = budget // bytes_per_block
    if blocks <= 0:
        raise ValueError(
            "not enough memory for any KV cache block; lower the model size or raise the memory share"
        )
    return blocks


def activation_reserve(config: EngineConfig, model_config: ModelConfig) -> int:
    """Room for one step's activations and logits at the token budget (conservative estimate)."""
    tokens = config.max_num_batched_tokens
    per_token = (4 * model_config.hidden_size + 2 * model_config.intermediate_size) * 4
    logits = config.max_num_seqs * model_config.vocab_size * 4 * 3
    return tokens * per_token + logits + (256 << 20)


def allocate_kv_cache(
    model: torch.nn.Module,
    config: EngineConfig,
    model_config: ModelConfig,
    num_blocks: int,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """A zeroed cache of `num_blocks` blocks (`dtype`: the cache's), each attention layer bound to its
    keys and values."""
    shape = kv_cache_shape(model_config, config, num_blocks, dtype)
    kv_cache = torch.zeros(shape, dtype=dtype, device=device)
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    for layer, (k, v) in zip(layers, kv_fp8.layer_views(kv_cache, config.kvcache_block_size), strict=False):
        layer.k_cache, layer.v_cache = k, v
    logger.info("KV cache: %d blocks x %d tokens (%s)", num_blocks, config.kvcache_block_size, dtype)
    return kv_cache
