"""The multiplexed engine's CPU tests' shared pieces: greedy parameters and a tiny engine whose chunks
launch in parts (tests/unit/common/multiplex/)."""

from __future__ import annotations

from common import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


def tiny_llm(model_dir: str, **kw) -> LLM:
    """A small KV cache and a 32-token step budget; multiplexed, its chunks run one layer a part (the
    tiny models' 2 layers: chunks in 2 parts)."""
    llm = LLM(model_dir, num_kvcache_blocks=96, kvcache_block_size=16, max_num_batched_tokens=32, **kw)
    if llm.engine.multiplexer is not None:
        llm.engine.multiplexer.layers_per_part = 1
    return llm
