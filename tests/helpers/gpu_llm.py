"""What the GPU engine tests share: random prompt ids and a small engine that leaves the GPU room for
the next one (tests/unit/common/test_gpu_engine.py, test_gpu_fp8_engine.py)."""

from __future__ import annotations

import gc
import random

import torch

from common import LLM


def random_prompts(n: int, lo: int, hi: int, seed: int = 0) -> list[list[int]]:
    """`n` prompts of `lo`..`hi` ids below Qwen3's vocabulary."""
    rng = random.Random(seed)
    return [[rng.randrange(151000) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def small_gpu_llm(model: str, **kw) -> LLM:
    """An engine on 35% of the GPU, after giving back what earlier engines of the test left cached."""
    gc.collect()
    torch.cuda.empty_cache()
    return LLM(model, gpu_memory_utilization=0.35, max_model_len=4096, max_num_seqs=64, **kw)
