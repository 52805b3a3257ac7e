"""Generate with an `LLM` while counting the preemptions its engine steps made; shared by the run-ahead
and multiplexed-mode tests, which compare such runs across engine configurations."""

from __future__ import annotations

from common import LLM, SamplingParams


def generate_counted(
    llm: LLM, prompts: list[list[int]], params: list[SamplingParams]
) -> tuple[list[tuple[list[int], str]], int]:
    """Each request's (tokens, finish reason) and the number of preemptions; asserts that every KV
    block came back to the free list afterwards."""
    engine, preempted = llm.engine, 0
    step = engine.step

    def counting_step():
        nonlocal preempted
        result = step()
        preempted += result.num_preempted
        return result

    engine.step = counting_step
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
    finally:
        engine.step = step
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and all(b.ref_count == 0 for b in bm.blocks)
    return [(o["token_ids"], o["finish_reason"]) for o in outs], preempted
