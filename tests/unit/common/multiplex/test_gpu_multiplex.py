"""Multiplexed mode on a CUDA GPU: float32 greedy tokens equal the aggregated offline engine's (prefix
hits included, prompts arriving while others decode, so chunks really run beside run-ahead decode
steps on the high-priority stream and SM shares), and the start-up bf16 GEMM check passes on the
shares in use. Skipped without CUDA.

Uses Qwen3-0.6B-architecture float32 weights with a fixed seed (common.tools.random_model)."""

from __future__ import annotations

import pytest
import torch

from common import LLM, SamplingParams
from tests.helpers.gpu_llm import shared_prefix_prompts, small_gpu_llm
from tests.helpers.staggered import run_staggered

pytestmark = pytest.mark.gpu
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def _llm(model: str, **kw) -> LLM:
    return small_gpu_llm(model, dtype="float32", max_num_batched_tokens=512, **kw)


def _outputs(llm: LLM) -> tuple[list[list[int]], dict[str, list[int]]]:
    prompts = shared_prefix_prompts(0, shortest=10)
    rounds = [o["token_ids"] for _ in range(2) for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    return rounds, run_staggered(
        llm.engine, shared_prefix_prompts(1, shortest=10) + prompts, GREEDY
    )  # the second: prefix hits again


@pytest.fixture(scope="module")
def aggregated_outputs(qwen3_fp32):
    plain = _llm(qwen3_fp32)
    want = _outputs(plain)
    del plain
    return want


# Chunks launched whole, or 4 layers a step; or prompts of up to 256 uncached tokens (the prefix hits'
# tails among them) inlined in decode steps while the longer ones still run as chunks on shares; or as
# many prompt tokens inlined as the measured break-even allows (however many that is on this device);
# or each new chunk started after its engine step's decode step (`chunk_after_decode`); the split holds
# twice the solo decode gap (`itl_target_solo_ratio` 2, the default) or the fixed target alone (0).
@pytest.mark.parametrize(
    "layers_per_part,inline,measured,after,ratio",
    [(None, 0, False, False, 2.0), (4, 0, False, False, 2.0), (None, 256, False, False, 2.0)]
    + [(None, 0, True, False, 2.0), (None, 0, False, True, 2.0), (None, 0, False, False, 0)],
)
def test_fp32_greedy_equals_aggregated(
    qwen3_fp32, aggregated_outputs, layers_per_part, inline, measured, after, ratio, monkeypatch
):
    want = aggregated_outputs
    if layers_per_part is not None:  # chunks that fit a prefill graph launch whole
        monkeypatch.setenv("PDSERVE_PREFILL_GRAPHS", "0")
    mux = _llm(
        qwen3_fp32,
        pd_multiplex=True,
        mux_inline_prompt_tokens=inline,
        mux_inline_measured=measured,
        itl_target_solo_ratio=ratio,
    )
    stepper = mux.engine.multiplexer
    assert stepper is not None, "multiplexed mode was refused (see the log: GEMM check)"
    stepper.layers_per_part = layers_per_part
    stepper.chunk_after_decode = after
    assert stepper.ahead  # decode steps run ahead on CUDA by default
    hits = mux.engine.block_manager.stats.hit_tokens
    got = _outputs(mux)
    differ = [i for i, (a, b) in enumerate(zip(got[0], want[0], strict=True)) if a != b]
    differ_staggered = [k for k in want[1] if got[1].get(k) != want[1][k]]
    print("requests that differ:", differ, differ_staggered)
    assert got == want
    assert mux.engine.block_manager.stats.hit_tokens - hits >= 4 * 300
    shares = [lane.sms for lane in stepper.partitions.lanes]
    print("lanes:", shares, "chunks per lane:", stepper.stats.chunks_per_lane, stepper.stats)
    assert stepper.stats.decode_steps_beside > 0
    if measured:
        print("inline budget:", stepper.inline_budget.tokens, "inlined:", mux.engine.timings.inline_prompts)
    else:
        assert (mux.engine.timings.inline_prompts > 0) == (inline > 0)
    if layers_per_part is not None:  # some chunks were launched beside decode steps, in parts
        assert stepper.stats.chunk_parts > sum(stepper.stats.chunks_per_lane.values())
    assert any(shares[i] is not None for i in stepper.stats.chunks_per_lane)  # some chunk ran on a share
    if ratio:  # solo gaps were read: the target is twice their median, under the configured 30 ms
        print("target:", stepper.controller.target)
        assert stepper.controller.target < stepper.controller.config.itl_target_s


def test_gemm_check_passes_on_the_shares_in_use():
    from common.multiplex.green_contexts import GEMM_TOLERANCE, GreenContextPartitions, gemm_error

    device = torch.device("cuda", torch.cuda.current_device())
    partitions = GreenContextPartitions.build(device)
    print("bf16 GEMM relative error per share:", partitions.gemm_errors)
    in_use = partitions.lanes[:-1]
    assert in_use and partitions.lanes[-1].sms is None
    for lane in in_use:
        assert gemm_error(lane) <= GEMM_TOLERANCE  # again, now that every share exists
