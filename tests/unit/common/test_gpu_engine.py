"""The engine on a CUDA GPU: logits vs transformers (bf16), CUDA graphs vs eager, prefix hit vs miss.

Uses Qwen3-0.6B-architecture weights with a fixed seed, written by `common.tools.random_model` and loaded
through the normal safetensors path. Skipped on machines without CUDA.
"""

from __future__ import annotations

import pytest
import torch

from common import LLM, SamplingParams
from common.tools.random_model import write_random_model
from tests.helpers.gpu_llm import random_prompts, small_gpu_llm
from tests.helpers.recording import record_logits

pytestmark = pytest.mark.gpu
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return str(write_random_model(tmp_path_factory.mktemp("qwen3") / "m", "qwen3-0.6b", seed=0))


def test_logits_match_transformers_bf16(qwen3_dir):
    _assert_logits_match_transformers(qwen3_dir)


def test_one_row_steps_through_the_gemv_match_transformers_bf16(qwen3_dir, monkeypatch):
    """Every one-row projection on the streaming GEMV (the 0.6B shape's weights are under the skinny
    kernels' limit, so the limit is lowered): batch-1 decode steps, CUDA graphs with PDL, the norm
    before each projection launched with PDL too, must compute what transformers does."""
    calls = _route_projections_to_the_gemv(monkeypatch, max_rows=1)
    _assert_logits_match_transformers(qwen3_dir)
    assert (1, True) in calls and (1, False) in calls  # gate/up with SiLU*mul, and the plain projections


def test_steps_of_several_rows_through_the_gemv_match_cublas(qwen3_dir, monkeypatch):
    """Decode steps of 3 sequences (a 4-row graph, one row padding) on the GEMV compute what cuBLAS
    computes for them: the same logits within bf16 tolerance, step by step up to the first token that
    differs (a near-tie may round either way)."""
    prompts = random_prompts(3, 40, 300, seed=5)
    calls = _route_projections_to_the_gemv(monkeypatch, max_rows=0)  # 0: no step takes it
    want, want_logits = _greedy_with_logits(small_gpu_llm(qwen3_dir), prompts)
    assert not calls
    calls = _route_projections_to_the_gemv(monkeypatch, max_rows=4)
    got, got_logits = _greedy_with_logits(small_gpu_llm(qwen3_dir), prompts)
    assert {rows for rows, _ in calls} >= {4}
    steps = _steps_until_divergence(want, got, len(want_logits))
    assert steps >= 4
    for x, y in zip(want_logits[:steps], got_logits[:steps], strict=True):
        assert ((x - y).norm(dim=-1) / x.norm(dim=-1)).max().item() < 2e-2


def _route_projections_to_the_gemv(monkeypatch, max_rows: int) -> list[tuple[int, bool]]:
    """Projections of steps up to `max_rows` rows go to the GEMV, whatever their weight's size;
    returns the list its calls (rows, silu_mul) are recorded in."""
    from common.layers import fused, linear, triton_gemv
    from common.models import decoder

    calls: list[tuple[int, bool]] = []

    class Counting:
        def gemv(self, x, *args, **kwargs):
            calls.append((x.shape[0], kwargs.get("silu_mul", False)))
            return triton_gemv.gemv(x, *args, **kwargs)

    monkeypatch.setattr(fused, "SKINNY_MAX_WEIGHT_BYTES", 0)
    monkeypatch.setattr(fused, "gemv_max_rows", lambda: max_rows)
    for module in (linear, decoder):
        monkeypatch.setattr(module, "gemv", Counting)
    return calls


def _steps_until_divergence(a: list[list[int]], b: list[list[int]], steps: int) -> int:
    """Logit steps that saw the same tokens in both runs: up to and including the first difference."""
    first = next(
        (i for i in range(GREEDY.max_tokens) if any(x[i] != y[i] for x, y in zip(a, b, strict=True))), None
    )
    return steps if first is None else first + 1


def _assert_logits_match_transformers(model_dir: str) -> None:
    import transformers

    prompt = random_prompts(1, 200, 200)[0]
    llm = small_gpu_llm(model_dir)
    seen = record_logits(llm)
    out = llm.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=17, ignore_eos=True), use_tqdm=False
    )
    tokens = out[0]["token_ids"]
    del llm
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    with torch.no_grad():
        ref = hf(torch.tensor([prompt + tokens[:-1]], device="cuda")).logits[0, len(prompt) - 1 :].float()
    ours = torch.cat(seen)  # prefill step, then 16 decode steps (CUDA graphs)
    assert ours.shape == ref.shape
    rel = (ours - ref).norm(dim=-1) / ref.norm(dim=-1)
    assert rel.max().item() < 2e-2, rel.tolist()
    agree = (ours.argmax(-1) == ref.argmax(-1)).float().mean().item()
    assert agree >= 0.9


def _greedy_with_logits(llm: LLM, prompts) -> tuple[list[list[int]], list[torch.Tensor]]:
    seen = record_logits(llm)
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    return [o["token_ids"] for o in outs], seen


def test_cuda_graphs_match_eager(qwen3_dir, monkeypatch):
    """At a captured batch size the decode graph replays exactly the eager kernels: identical tokens.

    With a batch padded up to the next captured size, GEMMs of another shape may round
    differently, so there the logits must agree within bf16 tolerance step by step. Prefill steps
    stay eager here (prefill graphs pad too: tests/unit/common/runner/test_gpu_prefill_graphs.py).
    """
    monkeypatch.setenv("PDSERVE_PREFILL_GRAPHS", "0")
    exact, padded = random_prompts(16, 10, 300, seed=1), random_prompts(12, 10, 300, seed=4)
    eager = small_gpu_llm(qwen3_dir, enforce_eager=True)
    a, _ = _greedy_with_logits(eager, exact)
    a_pad, a_logits = _greedy_with_logits(eager, padded)
    del eager
    graphs = small_gpu_llm(qwen3_dir)
    assert graphs.engine.runner.graphs is not None
    b, _ = _greedy_with_logits(graphs, exact)
    b_pad, b_logits = _greedy_with_logits(graphs, padded)
    assert a == b
    steps = _steps_until_divergence(a_pad, b_pad, len(a_logits))
    assert steps >= 4
    for x, y in zip(a_logits[:steps], b_logits[:steps], strict=True):
        assert ((x - y).norm(dim=-1) / x.norm(dim=-1)).max().item() < 2e-2


def test_prefix_hit_matches_miss(qwen3_dir, monkeypatch):
    # Misses would prefill on FlashAttention and hits on Triton, which round differently in bf16: this
    # compares the cache, not the kernels (test_varlen_prefill.py does that), so both run on Triton.
    monkeypatch.setenv("PDSERVE_VARLEN_PREFILL", "0")
    prefix = random_prompts(1, 256, 256, seed=2)[0]
    prompts = [prefix + p for p in random_prompts(6, 5, 60, seed=3)]
    cold = small_gpu_llm(qwen3_dir, enable_prefix_caching=False)
    a = [o["token_ids"] for o in cold.generate(prompts, GREEDY, use_tqdm=False)]
    del cold
    warm = small_gpu_llm(qwen3_dir)
    warm.generate(prompts[:1], GREEDY, use_tqdm=False)
    hits = warm.engine.block_manager.stats.hit_tokens
    b = [o["token_ids"] for o in warm.generate(prompts, GREEDY, use_tqdm=False)]
    assert warm.engine.block_manager.stats.hit_tokens - hits >= 5 * 256
    assert a == b
