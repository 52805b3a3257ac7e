"""Prefill CUDA graphs on a CUDA GPU: the same tokens and logits as eager prefill and mixed steps.

float32 logits with and without the graphs agree step by step on a workload that exercises every
input a graph reads: prompts chunked at 512 tokens beside decode rows (mixed steps), steps padded up to
their bucket, prefix hits, and short prompts arriving while others decode so run-ahead sources land
in mixed steps (the first GPU runs, at d8a7b58 and 63be18c, lacked that last part; at 7b6af9c one arrival per
step left no step to run ahead). In bf16 a
prefill step's logits agree with eager within rounding. Skipped without CUDA.
Uses Qwen3-0.6B-architecture weights with a fixed seed (common.tools.random_model).
"""

from __future__ import annotations

import pytest
import torch

from common import SamplingParams
from common.runner.prefill_graphs import PrefillGraphs
from common.tools.random_model import write_random_model
from tests.helpers.gpu_llm import random_prompts, shared_prefix_prompts, small_gpu_llm
from tests.helpers.recording import record_logits
from tests.helpers.staggered import run_staggered

pytestmark = pytest.mark.gpu
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def _replays(llm) -> list[tuple[int, int, bool]]:
    """Wrap the runner's prefill graphs: each replay's (tokens, bucket, behind a run-ahead step) lands in
    the returned list."""
    graphs: PrefillGraphs = llm.engine.runner.prefill_graphs
    seen, run = [], graphs.run

    def counted(seqs, bucket, src_rows=None, lane=None):
        seen.append((sum(s.num_scheduled_tokens for s in seqs), bucket, src_rows is not None))
        return run(seqs, bucket, src_rows, lane)

    graphs.run = counted
    return seen


def _outputs(llm):
    """Greedy tokens of two rounds (the second all prefix hits), of a staggered run, and of short
    prompts arriving every other step (each admitted into a mixed step launched behind the run-ahead
    decode step between arrivals; one per step would make every step mixed, so none runs ahead); and
    every step's logits in order."""
    seen = record_logits(llm)
    prompts = shared_prefix_prompts(0, shortest=5)
    rounds = [o["token_ids"] for _ in range(2) for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    staggered = run_staggered(llm.engine, shared_prefix_prompts(1, shortest=5) + prompts, GREEDY)
    short = run_staggered(llm.engine, random_prompts(24, 5, 40, seed=7), GREEDY, every=2)
    return (rounds, staggered, short), seen


def test_float32_steps_match_eager(qwen3_fp32, monkeypatch):
    """Steps run the same schedule until a token differs, so their logits line up one to one; float32
    rounding of GEMMs padded to another shape is ~1e-6, a wrong input (a slot, a table, a source
    row) is O(1)."""
    monkeypatch.setenv("PDSERVE_PREFILL_GRAPHS", "0")
    eager = small_gpu_llm(qwen3_fp32, dtype="float32", max_num_batched_tokens=512)
    assert eager.engine.runner.prefill_graphs is None
    want, want_logits = _outputs(eager)
    del eager
    monkeypatch.setenv("PDSERVE_PREFILL_GRAPHS", "1")
    graphs = small_gpu_llm(qwen3_fp32, dtype="float32", max_num_batched_tokens=512)
    replays = _replays(graphs)
    got, got_logits = _outputs(graphs)
    steps = next(
        (i for i, (x, y) in enumerate(zip(want_logits, got_logits, strict=False)) if not _same_tokens(x, y)),
        min(len(want_logits), len(got_logits)) - 1,
    )
    worst = max(_rel(x, y) for x, y in zip(want_logits[: steps + 1], got_logits[: steps + 1], strict=True))
    hits = graphs.engine.block_manager.stats.hit_tokens
    padded = sum(t < b for t, b, _ in replays)
    ahead = sum(a for _, _, a in replays)
    print(f"prefill graph replays {len(replays)} (padded {padded}, behind run-ahead {ahead}), hits {hits}")
    print(f"steps alike {steps + 1}/{len(want_logits)}, worst relative logit error {worst:.3g}")
    print(f"tokens equal: {got == want}")
    assert worst < 1e-3
    assert steps >= 20  # the first steps (prompt chunks, then mixed steps) at least
    assert padded and any(t == 512 for t, _, _ in replays) and hits >= 3 * 288
    assert ahead  # some mixed step read its decode rows' tokens from the device (run-ahead sources)


def _same_tokens(x: torch.Tensor, y: torch.Tensor) -> bool:
    return x.shape == y.shape and bool((x.argmax(-1) == y.argmax(-1)).all())


def _rel(x: torch.Tensor, y: torch.Tensor) -> float:
    if x.shape != y.shape:
        return float("inf")
    return ((x - y).norm(dim=-1) / x.norm(dim=-1)).max().item()


def test_bf16_prefill_logits_match_eager(tmp_path, monkeypatch):
    model = str(write_random_model(tmp_path / "m", "qwen3-0.6b", seed=0))
    prompts = random_prompts(5, 30, 700, seed=5)
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    logits = []
    for flag in ("0", "1"):
        monkeypatch.setenv("PDSERVE_PREFILL_GRAPHS", flag)
        llm = small_gpu_llm(model)
        seen = record_logits(llm)
        llm.generate(prompts, params, use_tqdm=False)
        logits.append(torch.cat(seen))
        del llm
    eager, graphs = logits
    assert eager.shape == graphs.shape == (5, eager.shape[-1])
    rel = (eager - graphs).norm(dim=-1) / eager.norm(dim=-1)
    assert rel.max().item() < 2e-2, rel.tolist()
