"""A worker's engine is built by the one builder (`LLMEngine.from_config` with the worker's runner), so
everything the config asks for is there: the speculative proposer, the shared-GPU KV sizing, the role.

(Here, not in tests/unit/common, for the reason test_worker_common.py gives.)"""

from __future__ import annotations

import pytest
import torch

from common import LLM, SamplingParams
from common.config import EngineConfig
from common.spec_decode.draft_proposer import DraftModelProposer
from common.spec_decode.speculative import NgramProposer
from common.worker.engine_factory import SharedGpuRunner, build_engine

PROMPTS = [[5, 6, 7, 8] * 6, [40, 41, 42] * 5 + [9]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def run_to_completion(engine, prompts: list[list[int]]) -> list[list[int]]:
    seqs = [engine.add_request(p, GREEDY, f"r{i}") for i, p in enumerate(prompts)]
    while engine.has_unfinished:
        engine.step()
    return [s.completion_token_ids for s in seqs]


@pytest.mark.parametrize("speculative", ["ngram", "draft"])
def test_worker_engine_has_the_configured_proposer(tiny_model_dirs, speculative) -> None:
    model = tiny_model_dirs["llama"]
    draft = {"draft_model": tiny_model_dirs["qwen2"]} if speculative == "draft" else {}
    config = EngineConfig(model, role="decode", num_kvcache_blocks=64, speculative=speculative, **draft)
    engine = build_engine(config)
    try:
        assert isinstance(engine.runner, SharedGpuRunner)  # the worker path, not a plain ModelRunner
        expected = DraftModelProposer if speculative == "draft" else NgramProposer
        assert isinstance(engine.scheduler.speculator.proposer, expected)
        reference = LLM(model, num_kvcache_blocks=64).generate(PROMPTS, GREEDY, use_tqdm=False)
        assert run_to_completion(engine, PROMPTS) == [o["token_ids"] for o in reference]
        assert engine.scheduler.speculator.stats.proposed > 0  # it did speculate
    finally:
        engine.close()


def test_worker_engine_refuses_tensor_parallel(tiny_model_dirs) -> None:
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        build_engine(EngineConfig(tiny_model_dirs["llama"], role="decode", tensor_parallel_size=2))


@pytest.mark.gpu
def test_gpu_worker_engine_speculates_with_a_draft_model(tiny_model_dirs) -> None:
    """Eager, so the fixed batch rule decides (as on the CPU): with CUDA graphs the measured-cost
    policy weighs drafts against this tiny model's graph replays and found none worth verifying on
    the H100 and H200 (`proposed == 0`), which says nothing about the draft path this test is for."""
    model = tiny_model_dirs["llama"]
    config = EngineConfig(
        model,
        role="decode",
        device="cuda",
        gpu_memory_utilization=0.2,
        speculative="draft",
        draft_model=model,
        max_model_len=512,
        enforce_eager=True,
    )
    engine = build_engine(config)
    try:
        assert engine.runner.platform.is_cuda and isinstance(engine.runner, SharedGpuRunner)
        assert isinstance(engine.scheduler.speculator.proposer, DraftModelProposer)
        run_to_completion(engine, PROMPTS)
        assert engine.scheduler.speculator.stats.accepted > 0  # the draft is the target: drafts are accepted
    finally:
        engine.close()
        torch.cuda.empty_cache()
