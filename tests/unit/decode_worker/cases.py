"""Prompts shared by the decode-worker tests, and the offline engine's greedy answers to them."""

from __future__ import annotations

from common import LLM, SamplingParams

PROMPTS = [[(i * 37 + k * 101 + 11) % 500 for i in range(n)] for k, n in enumerate((5, 16, 40, 70))]
MAX_TOKENS = 10


def offline_reference(model: str) -> list[list[int]]:
    llm = LLM(model, num_kvcache_blocks=64)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return [o["token_ids"] for o in llm.generate(PROMPTS, params, use_tqdm=False)]
