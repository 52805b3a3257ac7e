"""Drive an engine with one request arriving per step, so new prompts start while others decode
(the multiplexed mode's prefill chunks beside decode steps); shared by its CPU and GPU tests."""

from __future__ import annotations

from common import SamplingParams
from common.llm_engine import LLMEngine


def run_staggered(
    engine: LLMEngine, prompts: list[list[int]], params: SamplingParams, every: int = 1
) -> dict[str, list[int]]:
    """Each request's tokens by request id (its index in `prompts`); a request arrives every `every`
    steps (with 2, a pure decode step runs ahead between arrivals and the next prompt is admitted
    behind it)."""
    out: dict[str, list[int]] = {}
    pending = list(enumerate(prompts))
    steps = 0
    while pending or engine.has_unfinished:
        steps += 1
        if pending and steps % every == 0:
            i, prompt = pending.pop(0)
            engine.add_request(prompt, params, request_id=str(i))
        for update in engine.step().updates:
            out.setdefault(update.seq.request_id, []).append(update.new_token_id)
    return out
