"""Prefix hits, chunked prefill and preemption change how KV is computed, never the greedy tokens."""

from __future__ import annotations

import random

from common import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


def _shared_prefix_prompts() -> list[list[int]]:
    rng = random.Random(7)
    prefix = [rng.randrange(512) for _ in range(80)]
    return [prefix + [rng.randrange(512) for _ in range(n)] for n in (1, 9, 23, 40)]


def _baseline(model_dir: str, prompts: list[list[int]]) -> list[list[int]]:
    llm = LLM(model_dir, num_kvcache_blocks=256, enable_prefix_caching=False)
    return [llm.generate([p], GREEDY, use_tqdm=False)[0]["token_ids"] for p in prompts]


def test_prefix_cache_hits_give_identical_tokens(tiny_model_dirs):
    model_dir = tiny_model_dirs["qwen2"]
    prompts = _shared_prefix_prompts()
    expected = _baseline(model_dir, prompts)
    llm = LLM(model_dir, num_kvcache_blocks=256, kvcache_block_size=16)
    first = llm.generate(prompts[:1], GREEDY, use_tqdm=False)
    hits_before = llm.engine.block_manager.stats.hit_tokens
    rest = llm.generate(prompts[1:], GREEDY, use_tqdm=False)
    assert [o["token_ids"] for o in first + rest] == expected
    # Each later prompt reuses the 80-token prefix's 5 full blocks.
    assert llm.engine.block_manager.stats.hit_tokens - hits_before >= 3 * 80
    again = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o["token_ids"] for o in again] == expected


def test_chunked_prefill_with_tiny_budget(tiny_model_dirs):
    model_dir = tiny_model_dirs["llama"]
    prompts = _shared_prefix_prompts()
    expected = _baseline(model_dir, prompts)
    # A 7-token budget splits every prompt into many chunks, several prompts per step.
    llm = LLM(model_dir, num_kvcache_blocks=256, max_num_batched_tokens=7, enable_prefix_caching=False)
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o["token_ids"] for o in outs] == expected


def test_preemption_with_tiny_cache(tiny_model_dirs):
    model_dir = tiny_model_dirs["qwen3"]
    rng = random.Random(3)
    prompts = [[rng.randrange(512) for _ in range(n)] for n in (30, 45, 20, 50, 38, 27)]
    expected = _baseline(model_dir, prompts)
    # 16 blocks of 8 tokens = 128 slots; six sequences of ~70 tokens must take turns.
    llm = LLM(model_dir, num_kvcache_blocks=16, kvcache_block_size=8, max_num_batched_tokens=64)
    preempted = 0
    original_step = llm.engine.step

    def counting_step():
        nonlocal preempted
        result = original_step()
        preempted += result.num_preempted
        return result

    llm.engine.step = counting_step
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert preempted > 0
    assert [o["token_ids"] for o in outs] == expected
