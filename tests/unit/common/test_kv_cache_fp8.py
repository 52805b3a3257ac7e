"""The opt-in fp8 KV cache on the CPU engine (torch backend): the flag, the memory it saves, logits and
greedy tokens against the full-precision cache, prefix-cache hits on fp8 blocks."""

from __future__ import annotations

import argparse
import random

import pytest
import torch

from common import LLM, SamplingParams
from common.config import EngineConfig
from common.engine_args import add_engine_args, engine_argv, engine_config_from_args
from tests.helpers.recording import record_logits

NEW_TOKENS = 32
# Tolerance on each step's logits, |fp8 - fp32| / |fp32| (L2 over the vocabulary), on the tiny random
# models with an fp32 reference cache. Measured (6 prompts x 3 architectures, 2026-12): at most 0.084
# (their bf16 engine, weights and all: up to 0.03); with each token read with its neighbour's scales
# (a layout bug) at least 0.28 and the tokens part at step 0 or 1.
REL_TOL = 0.15


def test_kv_cache_dtype_is_validated_and_auto_by_default():
    assert EngineConfig(model="m").kv_cache_dtype == "auto"
    assert EngineConfig(model="m", kv_cache_dtype="fp8").kv_cache_dtype == "fp8"
    for bad in ("float8", "FP8", "", None, "bfloat16"):
        with pytest.raises(ValueError, match="kv_cache_dtype"):
            EngineConfig(model="m", kv_cache_dtype=bad)


def test_kv_cache_dtype_flag_reaches_the_engine_config():
    parser = add_engine_args(argparse.ArgumentParser())
    args = parser.parse_args(["--kv-cache-dtype", "fp8"])
    args.model = "m"
    assert engine_config_from_args(args, "decode").kv_cache_dtype == "fp8"
    assert engine_argv({"kv_cache_dtype": "fp8"}) == ["--kv-cache-dtype", "fp8"]  # the launcher forwards it
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "int4"])


def test_fp8_blocks_are_sized_with_their_scales(tiny_model_dirs):
    """Bytes per block count the scale rows, and the same memory budget holds 4x fp32's blocks less
    what the scales take."""
    model_dir = tiny_model_dirs["qwen3"]  # fp32 model on the CPU, head_dim 32, 2 KV heads, 2 layers
    full = LLM(model_dir, cpu_kvcache_gb=0.01)
    fp8 = LLM(model_dir, cpu_kvcache_gb=0.01, kv_cache_dtype="fp8")
    cache = fp8.engine.kv_cache
    assert cache.dtype == torch.float8_e4m3fn and cache.shape[3] == 16 + 2  # 16 tokens + 2 scale rows
    assert fp8.engine.runner.kv_bytes_per_block == cache[:, :, 0].numel() == 2 * 2 * 18 * 2 * 32
    assert full.engine.runner.kv_bytes_per_block == 2 * 2 * 16 * 2 * 32 * 4
    ratio = fp8.engine.runner.num_kv_blocks / full.engine.runner.num_kv_blocks
    assert ratio == pytest.approx(4 * 16 / 18, rel=0.01)


def _prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(512) for _ in range(n)] for n in (3, 17, 33, 64, 101, 150)]


def _run(llm: LLM, prompt: list[int]) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens of one prompt and the logits of every step (prefill, then one per decode step)."""
    seen = record_logits(llm)
    out = llm.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True), use_tqdm=False
    )
    return out[0]["token_ids"], torch.cat(seen)


def _first_divergence(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_fp8_logits_stay_close_and_tokens_part_only_at_near_ties(tiny_model_dirs, arch):
    """Up to and including the first step where the tokens differ, both runs saw the same context: the
    logits there differ by fp8's error only (REL_TOL), and the step where they part is one where the
    reference's top two logits are within twice that step's largest difference (a near tie, which
    random tiny models have many of), never a confident token."""
    ref_llm = LLM(tiny_model_dirs[arch], num_kvcache_blocks=128)
    fp8_llm = LLM(tiny_model_dirs[arch], num_kvcache_blocks=128, kv_cache_dtype="fp8")
    worst, firsts = 0.0, []
    for prompt in _prompts():
        ref_tokens, ref_logits = _run(ref_llm, prompt)
        tokens, logits = _run(fp8_llm, prompt)
        first = _first_divergence(ref_tokens, tokens)
        firsts.append(first)
        n = NEW_TOKENS if first is None else first + 1  # steps with the same context in both runs
        diff = logits[:n] - ref_logits[:n]
        rel = (diff.norm(dim=-1) / ref_logits[:n].norm(dim=-1)).max().item()
        worst = max(worst, rel)
        assert rel < REL_TOL, (len(prompt), rel)
        if first is not None:
            top2 = ref_logits[first].topk(2).values
            assert (top2[0] - top2[1]).item() <= 2 * diff[first].abs().max().item(), (first, top2.tolist())
    print(f"{arch}: worst relative logit error {worst:.3f}, first divergences {firsts}")


def test_prefix_cache_hits_read_fp8_blocks(tiny_model_dirs):
    """Later prompts reuse the fp8 blocks (values and scales) of an 80-token shared prefix: the same
    tokens as an fp8 engine that recomputes every prompt."""
    rng = random.Random(7)
    prefix = [rng.randrange(512) for _ in range(80)]
    prompts = [prefix + [rng.randrange(512) for _ in range(n)] for n in (1, 9, 23, 40)]
    greedy = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    cold = LLM(
        tiny_model_dirs["qwen2"], num_kvcache_blocks=256, kv_cache_dtype="fp8", enable_prefix_caching=False
    )
    expected = [cold.generate([p], greedy, use_tqdm=False)[0]["token_ids"] for p in prompts]
    llm = LLM(tiny_model_dirs["qwen2"], num_kvcache_blocks=256, kv_cache_dtype="fp8")
    first = llm.generate(prompts[:1], greedy, use_tqdm=False)
    hits_before = llm.engine.block_manager.stats.hit_tokens
    rest = llm.generate(prompts[1:], greedy, use_tqdm=False)
    assert llm.engine.block_manager.stats.hit_tokens - hits_before >= 3 * 80
    assert [o["token_ids"] for o in first + rest] == expected
