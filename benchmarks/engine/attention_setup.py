"""Shapes, inputs and timers of the attention micro-benchmark (benchmarks/engine/attention_kernels.py):
Qwen3-0.6B's heads, paged KV caches in shuffled blocks, packed fresh-prompt steps, and the two timers
(CUDA-graph replays for decode-sized kernels, back-to-back eager calls for prefill-sized ones)."""

from __future__ import annotations

import torch

from common.attention.base import AttentionMetadata
from common.wire.blocks import blocks_for

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, NUM_LAYERS = 16, 8, 128, 28  # Qwen3-0.6B
DTYPE = torch.bfloat16
PEAK_TBPS = 4.26  # device-to-device copy bandwidth measured on the H200 (docs: KINDS.md)
CALLS_PER_GRAPH = 20
REPLAYS = 10
PREFILL_SHAPES = ((8, 2048), (1, 8192))  # (prompts, tokens each): the latency benchmark's and one long prompt


def make_paged(batch: int, ctx: int, block_size: int):
    """KV caches holding `ctx` tokens for each of `batch` sequences in shuffled blocks, plus metadata."""
    per_seq = blocks_for(ctx, block_size)
    num_blocks = batch * per_seq
    shape = (num_blocks, block_size, NUM_KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, device="cuda", dtype=DTYPE)
    v_cache = torch.randn(shape, device="cuda", dtype=DTYPE)
    tables = torch.randperm(num_blocks, device="cuda").to(torch.int32).view(batch, per_seq)
    return k_cache, v_cache, tables


def decode_meta(batch: int, ctx: int, tables: torch.Tensor) -> AttentionMetadata:
    return AttentionMetadata(
        is_decode=True,
        slot_mapping=torch.full((batch,), -1, dtype=torch.int64, device="cuda"),
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device="cuda"),
        seq_lens=torch.full((batch,), ctx, dtype=torch.int32, device="cuda"),
        block_tables=tables,
        max_query_len=1,
        max_seq_len=ctx,
    )


def time_graph(fn) -> float:
    """Seconds per call of `fn`, from CUDA-graph replays of CALLS_PER_GRAPH back-to-back calls."""
    fn()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS_PER_GRAPH):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPLAYS):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / (REPLAYS * CALLS_PER_GRAPH)


def time_stream(fn, calls: int = 20) -> float:
    """Seconds per call of back-to-back eager calls (CUDA events). For prefill-sized kernels (0.1 ms and
    up) the host runs ahead of the GPU, so launch costs are hidden, as they are in an engine prefill step;
    unlike `time_graph` this also takes calls that CUDA graphs cannot capture."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / calls


def prefill_flops(num_seqs: int, seq_len: int) -> float:
    """Causal attention FLOPs: QK^T and PV over the lower triangle, every query head."""
    return 4 * NUM_HEADS * HEAD_DIM * num_seqs * seq_len * (seq_len + 1) / 2


def packed_step(num_seqs: int, seq_len: int):
    """A fresh prefill step as the model produces it: q [T, H, D] and k/v as views of one fused tensor."""
    tokens = num_seqs * seq_len
    qkv = torch.randn(tokens, NUM_HEADS + 2 * NUM_KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    q = qkv[:, :NUM_HEADS].contiguous()
    k = qkv[:, NUM_HEADS : NUM_HEADS + NUM_KV_HEADS].contiguous()  # the qkv kernel's packed k
    v = qkv[:, NUM_HEADS + NUM_KV_HEADS :]  # read in place
    starts = torch.arange(0, num_seqs + 1, dtype=torch.int32, device="cuda") * seq_len
    return q, k, v, starts
