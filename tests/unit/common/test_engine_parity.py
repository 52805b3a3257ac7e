"""Greedy outputs of the engine equal Hugging Face transformers token for token (fp32, CPU)."""

from __future__ import annotations

import random

import pytest

from common import LLM, SamplingParams
from common.tools.tiny_models import hf_greedy

NEW_TOKENS = 40


def _prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(512) for _ in range(n)] for n in (3, 17, 33, 64, 101)]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_greedy_matches_transformers(tiny_model_dirs, arch):
    model_dir = tiny_model_dirs[arch]
    prompts = _prompts()
    reference = hf_greedy(model_dir, prompts, NEW_TOKENS)
    llm = LLM(model_dir, num_kvcache_blocks=128, kvcache_block_size=16)
    greedy = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate(prompts, greedy, use_tqdm=False)
    for out, ref in zip(outs, reference, strict=True):
        assert out["token_ids"] == ref
        assert out["finish_reason"] == "length"


def test_large_block_size_matches_small(tiny_model_dirs):
    """Block size changes placement only, never results."""
    prompts = _prompts(1)
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    small = LLM(tiny_model_dirs["qwen3"], num_kvcache_blocks=256, kvcache_block_size=16)
    large = LLM(tiny_model_dirs["qwen3"], num_kvcache_blocks=8, kvcache_block_size=256)
    a = [o["token_ids"] for o in small.generate(prompts, greedy, use_tqdm=False)]
    b = [o["token_ids"] for o in large.generate(prompts, greedy, use_tqdm=False)]
    assert a == b
