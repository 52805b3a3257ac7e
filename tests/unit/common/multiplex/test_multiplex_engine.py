"""Multiplexed mode on the CPU (inline partitions): the same greedy tokens as the aggregated engine."""

from __future__ import annotations

import random

import pytest

from common import LLM, SamplingParams
from common.multiplex.partitions import InlinePartitions
from tests.helpers.staggered import run_staggered

GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)


def _prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(512) for _ in range(40)]  # a prefix the later prompts hit in the cache
    fresh = [[rng.randrange(512) for _ in range(n)] for n in (3, 17, 70, 101)]
    return fresh + [shared + [rng.randrange(512) for _ in range(n)] for n in (5, 23)] + [shared]


def _llm(model_dir: str, **kw) -> LLM:
    return LLM(model_dir, num_kvcache_blocks=96, kvcache_block_size=16, max_num_batched_tokens=32, **kw)


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_greedy_equals_aggregated(tiny_model_dirs, arch):
    prompts = _prompts()
    plain = _llm(tiny_model_dirs[arch])
    mux = _llm(tiny_model_dirs[arch], pd_multiplex=True)
    assert isinstance(mux.engine.multiplexer.partitions, InlinePartitions)
    # Twice: the second round's prompts hit the prefix cache filled by the first.
    for _ in range(2):
        want = [o["token_ids"] for o in plain.generate(prompts, GREEDY, use_tqdm=False)]
        got = [o["token_ids"] for o in mux.generate(prompts, GREEDY, use_tqdm=False)]
        assert got == want
    assert mux.engine.block_manager.num_free_blocks == mux.engine.block_manager.num_blocks


def test_staggered_arrivals_equal_aggregated(tiny_model_dirs):
    prompts = _prompts(1)
    plain = _llm(tiny_model_dirs["qwen3"])
    mux = _llm(tiny_model_dirs["qwen3"], pd_multiplex=True)
    assert run_staggered(mux.engine, prompts, GREEDY) == run_staggered(plain.engine, prompts, GREEDY)
    stats = mux.engine.multiplexer.stats
    assert stats.decode_steps_beside > 0 and sum(stats.chunks_per_lane.values()) > len(prompts)


def test_abort_of_a_chunk_in_flight_waits_for_it(tiny_model_dirs):
    mux = _llm(tiny_model_dirs["qwen3"], pd_multiplex=True)
    engine = mux.engine
    engine.add_request([5, 6, 7], GREEDY, request_id="b")
    engine.step()  # b's prompt: nothing decodes, so the chunk is waited for and resolved
    engine.add_request(list(range(1, 80)), GREEDY, request_id="a")
    engine.step()  # a's first chunk is launched, b decodes beside it; resolved by the next step
    assert engine.multiplexer.in_flight
    assert [s.request_id for s in engine.abort(["a", "b"])] == ["b"]  # b now; a is held
    assert [s.request_id for s in engine.scheduler.running] == ["a"]
    while engine.has_unfinished:
        engine.step()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_refuses_what_does_not_combine(tiny_model_dirs):
    with pytest.raises(ValueError, match="speculative"):
        _llm(tiny_model_dirs["qwen3"], pd_multiplex=True, speculative="ngram")
    with pytest.raises(ValueError, match="role"):
        _llm(tiny_model_dirs["qwen3"], pd_multiplex=True, role="prefill")
    with pytest.raises(ValueError, match="async_scheduling"):
        _llm(tiny_model_dirs["qwen3"], pd_multiplex=True, async_scheduling=True)
