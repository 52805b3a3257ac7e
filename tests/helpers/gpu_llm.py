"""What the GPU engine tests share: random prompt ids, float32 weights, and a small engine that leaves
the GPU room for the next one (test_gpu_engine.py, test_gpu_fp8_engine.py, test_gpu_multiplex.py,
test_gpu_prefill_graphs.py)."""

from __future__ import annotations

import gc
import random

import torch

from common import LLM


def random_prompts(n: int, lo: int, hi: int, seed: int = 0) -> list[list[int]]:
    """`n` prompts of `lo`..`hi` ids below Qwen3's vocabulary."""
    rng = random.Random(seed)
    return [[rng.randrange(151000) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def shared_prefix_prompts(seed: int, shortest: int = 10) -> list[list[int]]:
    """Ten fresh prompts of `shortest`..1,500 ids, then three that share a 300-id prefix with different
    tails, then the prefix alone: chunked prompts and prefix hits in one workload."""
    rng = random.Random(seed)
    shared = [rng.randrange(151000) for _ in range(300)]
    fresh = [[rng.randrange(151000) for _ in range(rng.randint(shortest, 1500))] for _ in range(10)]
    return fresh + [shared + [rng.randrange(151000) for _ in range(n)] for n in (7, 40, 200)] + [shared]


def qwen3_fp32_dir(tmp_path_factory) -> str:
    """Qwen3-0.6B-architecture float32 weights with seed 0, written once per module that asks."""
    from common.tools.random_model import write_random_model

    out = tmp_path_factory.mktemp("qwen3fp32") / "m"
    return str(write_random_model(out, "qwen3-0.6b", seed=0, dtype="float32"))


def small_gpu_llm(model: str, **kw) -> LLM:
    """An engine on 35% of the GPU, after giving back what earlier engines of the test left cached."""
    gc.collect()
    torch.cuda.empty_cache()
    return LLM(model, gpu_memory_utilization=0.35, max_model_len=4096, max_num_seqs=64, **kw)
