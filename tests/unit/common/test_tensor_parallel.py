"""Tensor parallelism: TP=2 computes what TP=1 computes, bad sizes are refused, worker processes end.

CPU tests run a real two-rank gloo group (rank 0 in the test process, rank 1 spawned). The GPU tests
need two CUDA devices (NCCL) and are skipped elsewhere.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import random
import signal
import time

import pytest
import torch

from common import LLM, SamplingParams
from common.tools.tiny_models import write_tiny_model
from tests.helpers.recording import record_logits

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
# Small token budget and blocks: prompts are chunked and the batch mixes prefill chunks with decodes.
CPU_OPTIONS = dict(num_kvcache_blocks=96, max_model_len=256, max_num_batched_tokens=48, kvcache_block_size=8)


def _prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(3, 70))] for _ in range(n)]
    prompts.append(prompts[0][:20] + [7, 8, 9])  # shares a prefix with the first: a prefix-cache hit
    return prompts


def _greedy(llm: LLM, prompts) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy completions and the logits of each step."""
    seen = record_logits(llm)
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    return [o["token_ids"] for o in outs], seen


def _gone(pids: list[int], within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while any(os.path.exists(f"/proc/{p}") for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tp2_matches_tp1(tiny_model_dirs, arch):
    prompts = _prompts(6, 512, seed=len(arch))
    single = LLM(tiny_model_dirs[arch], **CPU_OPTIONS)
    want_tokens, want_logits = _greedy(single, prompts)
    llm = LLM(tiny_model_dirs[arch], tensor_parallel_size=2, **CPU_OPTIONS)
    try:
        assert llm.engine.async_scheduling is False
        assert llm.engine.runner.kv_cache.shape[4] == 1  # one of the two KV heads per rank
        tokens, logits = _greedy(llm, prompts)
    finally:
        pids = llm.engine.runner.tp.workers.pids
        llm.close()
    assert tokens == want_tokens
    logits, want_logits = torch.cat(logits), torch.cat(want_logits)
    assert logits.shape == want_logits.shape
    assert torch.allclose(logits, want_logits, rtol=1e-4, atol=1e-4), (logits - want_logits).abs().max()
    assert _gone(pids)


def test_bad_size_names_the_field(tiny_model_dirs):
    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError, match="num_attention_heads"):
        LLM(tiny_model_dirs["qwen3"], tensor_parallel_size=3, **CPU_OPTIONS)
    assert set(multiprocessing.active_children()) == before  # refused before anything was started


@pytest.mark.parametrize(("field", "value"), [("intermediate_size", 129), ("vocab_size", 513)])
def test_unsplittable_model_field(tmp_path, field, value):
    model = write_tiny_model("llama", tmp_path / field, **{field: value})
    with pytest.raises(ValueError, match=field):
        LLM(str(model), tensor_parallel_size=2, **CPU_OPTIONS)


def test_workers_end_when_the_llm_is_collected(tiny_model_dirs):
    llm = LLM(tiny_model_dirs["qwen3"], tensor_parallel_size=2, **CPU_OPTIONS)
    pids = llm.engine.runner.tp.workers.pids
    assert len(pids) == 1 and not _gone(pids, within_s=0)
    del llm
    gc.collect()
    assert _gone(pids)


def test_dead_worker_is_an_error_not_a_hang(tiny_model_dirs):
    llm = LLM(tiny_model_dirs["qwen3"], tensor_parallel_size=2, **CPU_OPTIONS)
    try:
        llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)
        (pid,) = llm.engine.runner.tp.workers.pids
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(RuntimeError, match="rank 1"):
            llm.generate([[4, 5, 6]], GREEDY, use_tqdm=False)
        with pytest.raises(RuntimeError, match="failed earlier"):  # and it stays refused, promptly
            llm.generate([[7, 8, 9]], GREEDY, use_tqdm=False)
    finally:
        llm.close()
    assert _gone([pid])


def test_worker_start_failure_is_an_error(tiny_model_dirs, monkeypatch):
    """A worker that dies while starting (here: its imports fail) is reported, not waited for."""
    before = set(multiprocessing.active_children())
    monkeypatch.setenv("PDSERVE_TP_TIMEOUT_S", "not-a-number")  # read when the worker imports tp_group
    with pytest.raises(RuntimeError, match="rank 1 failed during start-up"):
        LLM(tiny_model_dirs["qwen3"], tensor_parallel_size=2, **CPU_OPTIONS)
    assert set(multiprocessing.active_children()) == before


# ---- two GPUs ----------------------------------------------------------------------------------
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")


@pytest.fixture(scope="module")
def qwen3_06b_dir(tmp_path_factory):
    from common.tools.random_model import write_random_model

    return str(write_random_model(tmp_path_factory.mktemp("qwen3") / "m", "qwen3-0.6b", seed=0))


@pytest.mark.gpu
@two_gpus
def test_tp2_matches_tp1_on_two_gpus(qwen3_06b_dir):
    prompts = _prompts(8, 151000)
    options = dict(gpu_memory_utilization=0.3, max_model_len=2048, max_num_seqs=32)
    single = LLM(qwen3_06b_dir, **options)
    want_tokens, want_logits = _greedy(single, prompts)
    del single
    gc.collect()
    torch.cuda.empty_cache()
    llm = LLM(qwen3_06b_dir, tensor_parallel_size=2, **options)
    try:
        tokens, logits = _greedy(llm, prompts)
    finally:
        llm.close()
    # The first step prefills every prompt: its logits are compared row by row. bf16 sums the shards'
    # partial products in another order, so a near-tie may flip a late token of one prompt.
    first, want_first = logits[0], want_logits[0]
    rel = (first - want_first).norm(dim=-1) / want_first.norm(dim=-1)
    assert rel.max().item() < 2e-2, rel.max().item()
    assert [t[0] for t in tokens] == [t[0] for t in want_tokens]
    assert sum(a == b for a, b in zip(tokens, want_tokens, strict=True)) >= len(prompts) - 1
