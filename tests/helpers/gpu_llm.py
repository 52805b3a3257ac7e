"""What the GPU engine tests share: random prompt ids, float32 weights, and a small engine that leaves
the GPU room for the next one (the GPU engine, fp8, multiplex, prefill-graph, run-ahead and speculative
tests)."""

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


# Every GPU engine test's KV pool, in tokens: more than any of their workloads holds at once (about
# 20,000 tokens with the prefix cache), and four test processes' pools fit one GPU beside their weights
# (Qwen3-0.6B shape in float32: 15 GB each).
TEST_KV_TOKENS = 65_536


def fixed_kv_blocks(block_size: int = 16) -> int:
    """A fixed KV pool. Sized from free memory instead, two engines of one test got different pools
    (whatever other test processes and earlier engines held at that moment), so their schedules
    (preemption, prefix evictions) and the compared logits differed, and beside three other test
    processes on one GPU some engines got no block at all."""
    return TEST_KV_TOKENS // block_size


def small_gpu_llm(model: str, max_model_len: int = 4096, max_num_seqs: int = 64, **kw) -> LLM:
    """An engine with a fixed KV pool (`fixed_kv_blocks`), after giving back what earlier engines of
    the test left cached."""
    gc.collect()
    torch.cuda.empty_cache()
    kw.setdefault("num_kvcache_blocks", fixed_kv_blocks(kw.get("kvcache_block_size", 16)))
    return LLM(model, max_model_len=max_model_len, max_num_seqs=max_num_seqs, **kw)
