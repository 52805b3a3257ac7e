"""Fresh-prompt prefill on PyTorch's FlashAttention (`varlen_prefill.py`) against the project's Triton
prefill kernel on random paged inputs; steps with a cached prefix, and float32, must stay on Triton.

GPU only (marked `gpu`). Each step is built the way the model builds it: q, k, v are views of one
fused projection, the new k/v are stored into shuffled cache slots first, and sequences with a cached
prefix find random earlier tokens in their blocks. Where this PyTorch has no usable `varlen_attn` the
FlashAttention cases skip (saying so) and prefill stays on Triton.
"""

from __future__ import annotations

import math

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")

from common.attention.base import AttentionMetadata, StepKV  # noqa: E402
from common.attention.context import ForwardContext, set_forward_context  # noqa: E402
from common.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from common.attention.triton_kernels.prefill_attention import paged_prefill_attention  # noqa: E402
from common.attention.triton_kernels.store_kv import store_kv  # noqa: E402
from common.attention.varlen_prefill import VarlenApi, find_varlen_api, varlen_prefill  # noqa: E402

pytestmark = [pytest.mark.gpu]

API = find_varlen_api()
needs_varlen = pytest.mark.skipif(
    API is None, reason=f"no usable varlen_attn in torch {torch.__version__}: prefill stays on Triton"
)
NUM_KV_HEADS, HEAD_DIM, SCALE = 2, 128, 128**-0.5
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 5e-3}
HALF = [torch.bfloat16, torch.float16]


class Step:
    """One prefill step: `prefix[i]` cached tokens and `q_lens[i]` new ones per sequence."""

    def __init__(self, prefix, q_lens, group, dtype, block_size=16, seed=0, kv_heads=NUM_KV_HEADS):
        gen = torch.Generator().manual_seed(seed)
        seq_lens = [p + n for p, n in zip(prefix, q_lens, strict=True)]
        per_seq = [math.ceil(s / block_size) for s in seq_lens]
        num_blocks = sum(per_seq) + 1
        shape = (num_blocks, block_size, kv_heads, HEAD_DIM)
        self.k_cache = torch.randn(shape, generator=gen).to("cuda", dtype)  # the cached prefixes
        self.v_cache = torch.randn(shape, generator=gen).to("cuda", dtype)
        ids = torch.randperm(num_blocks, generator=gen)
        tables = torch.full((len(seq_lens), max(per_seq)), int(ids[-1]), dtype=torch.int32)
        used = 0
        for i, n in enumerate(per_seq):
            tables[i, :n] = ids[used : used + n]
            used += n
        heads = group * kv_heads
        qkv = torch.randn(sum(q_lens), heads + 2 * kv_heads, HEAD_DIM, generator=gen).to("cuda", dtype)
        self.q = qkv[:, :heads].contiguous()
        self.kv = StepKV(qkv[:, heads : heads + kv_heads], qkv[:, heads + kv_heads :])
        starts = [0]
        for n in q_lens:
            starts.append(starts[-1] + n)
        slots = [
            int(tables[i, pos // block_size]) * block_size + pos % block_size
            for i, (p, s) in enumerate(zip(prefix, seq_lens, strict=True))
            for pos in range(p, s)
        ]
        self.meta = AttentionMetadata(
            is_decode=False,
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device="cuda"),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device="cuda"),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device="cuda"),
            block_tables=tables.to("cuda"),
            max_query_len=max(q_lens),
            max_seq_len=max(seq_lens),
            query_start_loc_host=starts,
            seq_lens_host=seq_lens,
        )
        store_kv(self.kv.k, self.kv.v, self.k_cache, self.v_cache, self.meta.slot_mapping)

    def triton(self) -> torch.Tensor:
        m = self.meta
        return paged_prefill_attention(
            self.q,
            self.k_cache,
            self.v_cache,
            m.block_tables,
            m.query_start_loc,
            m.seq_lens,
            SCALE,
            m.max_query_len,
        )

    def backend_prefill(self, backend: TritonAttentionBackend) -> torch.Tensor:
        return backend.prefill(self.q, self.k_cache, self.v_cache, self.meta, SCALE, self.kv)


def _check_varlen(step: Step) -> None:
    backend = TritonAttentionBackend(varlen_prefill=True)
    assert backend.prefill_reads_step_kv(step.meta, step.q.dtype, HEAD_DIM, SCALE)
    out = step.backend_prefill(backend)
    assert API is not None
    direct = varlen_prefill(
        API, step.q, step.kv.k, step.kv.v, step.meta.query_start_loc, step.meta.max_query_len, SCALE
    )
    assert torch.equal(out, direct), "a fresh half-precision step must take FlashAttention"
    assert not out.isnan().any()
    tol = TOLERANCE[out.dtype]
    torch.testing.assert_close(out.float(), step.triton().float(), atol=tol, rtol=tol)


FRESH_LENGTHS = {
    "one-token": [1],
    "short-mixed": [5, 17, 64, 300],
    "long": [2048],
    "uneven": [1000, 1, 333, 129],
}


@needs_varlen
@pytest.mark.parametrize("lengths", list(FRESH_LENGTHS))
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_fresh_prefill_matches_the_triton_kernel(lengths, dtype):
    q_lens = FRESH_LENGTHS[lengths]
    _check_varlen(Step([0] * len(q_lens), q_lens, group=2, dtype=dtype))


@needs_varlen
@pytest.mark.parametrize("group", [1, 2, 4, 8])
def test_fresh_prefill_gqa(group):
    _check_varlen(Step([0, 0, 0], [77, 513, 8], group=group, dtype=torch.bfloat16, seed=group))


@needs_varlen
@pytest.mark.parametrize("block_size", [16, 256])
def test_fresh_prefill_benchmark_shape(block_size):
    """Qwen3-0.6B's 16 q / 8 kv heads at 8 x 2,048 tokens, as benchmarks/engine/attention_kernels.py
    times it."""
    _check_varlen(Step([0] * 8, [2048] * 8, group=2, dtype=torch.bfloat16, block_size=block_size, kv_heads=8))


PREFIX_CASES = {
    "all-chunked": ([40, 300, 16], [7, 33, 20]),
    "one-hit": ([0, 45, 0], [7, 33, 20]),  # one prefix hit makes the whole step paged
    "one-token-chunks": ([99, 1], [1, 1]),
}


@pytest.mark.parametrize("case", list(PREFIX_CASES))
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_steps_with_a_cached_prefix_stay_on_triton(case, dtype):
    prefix, q_lens = PREFIX_CASES[case]
    step = Step(prefix, q_lens, group=4, dtype=dtype)
    backend = TritonAttentionBackend(varlen_prefill=True)
    assert not backend.prefill_reads_step_kv(step.meta, dtype, HEAD_DIM, SCALE)
    assert torch.equal(step.backend_prefill(backend), step.triton())


def test_float32_stays_on_triton():
    step = Step([0, 0], [50, 200], group=2, dtype=torch.float32)
    backend = TritonAttentionBackend(varlen_prefill=True)
    assert not backend.prefill_reads_step_kv(step.meta, torch.float32, HEAD_DIM, SCALE)
    assert torch.equal(step.backend_prefill(backend), step.triton())


def test_a_refused_varlen_call_falls_back_to_triton_for_good():
    def refuses(*args, **kwargs):
        raise RuntimeError("FlashAttention was not built for this GPU")

    step = Step([0, 0], [50, 200], group=2, dtype=torch.bfloat16)
    backend = TritonAttentionBackend(varlen_prefill=True)
    backend.varlen = VarlenApi(refuses, causal_by_window=True, takes_scale=True, takes_enable_gqa=True)
    assert torch.equal(step.backend_prefill(backend), step.triton())
    assert backend.varlen is None


@needs_varlen
def test_fused_layer_feeds_flash_attention_the_same_keys_it_caches():
    """The qkv kernel's packed k and the in-place v view give what the Triton path reads from the cache."""
    from common.layers.attention import Attention
    from common.layers.norm import RMSNorm
    from common.layers.rotary import RotaryEmbedding

    torch.manual_seed(0)
    heads, tokens = 4 * NUM_KV_HEADS, [300, 45, 1]
    step = Step([0] * len(tokens), tokens, group=4, dtype=torch.bfloat16)
    rope = RotaryEmbedding(HEAD_DIM, 4096, 1e6).to("cuda")
    q_norm, k_norm = (RMSNorm(HEAD_DIM).to("cuda", torch.bfloat16) for _ in range(2))
    k_norm.weight.data.normal_(1.0, 0.1)
    qkv = torch.randn(sum(tokens), (heads + 2 * NUM_KV_HEADS) * HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    positions = torch.cat([torch.arange(n) for n in tokens]).to("cuda")
    outs, caches = [], []
    for varlen in (True, False):
        layer = Attention(heads, HEAD_DIM, SCALE, NUM_KV_HEADS)
        layer.k_cache, layer.v_cache = torch.zeros_like(step.k_cache), torch.zeros_like(step.v_cache)
        backend = TritonAttentionBackend(varlen_prefill=varlen)
        assert backend.prefill_reads_step_kv(step.meta, torch.bfloat16, HEAD_DIM, SCALE) is varlen
        set_forward_context(ForwardContext(backend, step.meta))
        try:
            outs.append(layer.forward_qkv_fused(qkv, positions, rope, q_norm, k_norm))
        finally:
            set_forward_context(None)
        caches.append((layer.k_cache, layer.v_cache))
    assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])
    tol = TOLERANCE[torch.bfloat16]
    torch.testing.assert_close(outs[0].float(), outs[1].float(), atol=tol, rtol=tol)


# ------------------------------------------------------------------------------------------ engine


def _engine_run(model: str, dtype: str, prompts, varlen: bool, monkeypatch):
    """Greedy tokens, per-step logits and whether the backend had varlen, with the path on or off."""
    import gc

    from common import LLM, SamplingParams
    from tests.helpers.recording import record_logits

    monkeypatch.setenv("PDSERVE_VARLEN_PREFILL", "1" if varlen else "0")
    gc.collect()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    share = min(
        1.0, (total - free + (2 << 30)) / total
    )  # 2 GiB beyond what is in use (tests run side by side)
    llm = LLM(model, dtype=dtype, gpu_memory_utilization=share, max_model_len=1024, max_num_seqs=16)
    seen = record_logits(llm)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    tokens = [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
    has_varlen = llm.engine.runner.backend.varlen is not None
    del llm
    return tokens, seen, has_varlen


def _prompts(n: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 400, (n,), generator=gen).tolist()
    return [torch.randint(0, 512, (n_tok,), generator=gen).tolist() for n_tok in lengths]


def test_engine_float32_greedy_is_unchanged(tiny_model_dirs, monkeypatch):
    """fp32 never takes FlashAttention, so turning the path on changes nothing, token for token."""
    prompts = _prompts(6, seed=1)
    on, _, has_varlen = _engine_run(tiny_model_dirs["qwen3"], "float32", prompts, True, monkeypatch)
    off, _, _ = _engine_run(tiny_model_dirs["qwen3"], "float32", prompts, False, monkeypatch)
    assert has_varlen is (API is not None)
    assert on == off


@needs_varlen
def test_engine_bfloat16_prefill_on_flash_attention_matches_triton(tiny_model_dirs, monkeypatch):
    """bf16 fresh prompts: the prefill logits agree within bf16 tolerance, and so does every decode step
    up to the first token where the two runs part (a near-tie), if any."""
    prompts = _prompts(6, seed=2)
    on, on_logits, has_varlen = _engine_run(tiny_model_dirs["qwen3"], "bfloat16", prompts, True, monkeypatch)
    off, off_logits, _ = _engine_run(tiny_model_dirs["qwen3"], "bfloat16", prompts, False, monkeypatch)
    assert has_varlen
    first_diff = next((i for i in range(12) if any(a[i] != b[i] for a, b in zip(on, off, strict=True))), None)
    steps = len(on_logits) if first_diff is None else first_diff + 1
    for x, y in zip(on_logits[:steps], off_logits[:steps], strict=True):
        assert ((x - y).norm(dim=-1) / y.norm(dim=-1)).max().item() < 2e-2
