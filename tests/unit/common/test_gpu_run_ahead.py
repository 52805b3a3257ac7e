"""Run-ahead on a CUDA GPU with requests arriving mid-run: admissions launched behind an in-flight step
and sequences ending by length at their in-flight token give exactly the synchronous loop's tokens.

With ignore_eos and per-request max_tokens both loops launch the same batches (same shapes, same
kernels, the same CUDA graphs), so the greedy tokens agree bit for bit even in bf16. Skipped on
machines without CUDA.
"""

from __future__ import annotations

import random

import pytest

from common import SamplingParams
from common.tools.random_model import write_random_model
from tests.helpers.gpu_llm import small_gpu_llm

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(write_random_model(tmp_path_factory.mktemp("qwen3") / "m", "qwen3-0.6b", seed=0))


def _run(model: str, async_on: bool, arrivals: list[tuple[list[int], int]]) -> tuple[list, dict]:
    llm = small_gpu_llm(model, async_scheduling=async_on)
    engine, seqs = llm.engine, []
    for i, (prompt, n) in enumerate(arrivals):
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        seqs.append(engine.add_request(prompt, params, f"r{i}"))
        for _ in range(3):
            engine.step()
    while engine.has_unfinished:
        engine.step()
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    return [s.completion_token_ids for s in seqs], dict(engine.timings.drains)


def test_arrivals_and_length_ends_run_ahead_exactly(model_dir):
    rng = random.Random(3)
    arrivals = [
        ([rng.randrange(151000) for _ in range(rng.randint(5, 400))], rng.randint(4, 40)) for _ in range(12)
    ]
    sync, _ = _run(model_dir, False, arrivals)
    ahead, drains = _run(model_dir, True, arrivals)
    assert ahead == sync
    assert drains == {}, drains  # neither admissions nor length ends drained the pipeline
