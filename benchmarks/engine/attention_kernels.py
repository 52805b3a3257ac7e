"""GPU micro-benchmark of the Triton attention kernels (Qwen3-0.6B shapes).

Decode: achieved bandwidth = (KV bytes of every context + q + out) / kernel time, where the time is
taken with CUDA events around CUDA-graph replays of many back-to-back decode calls (no launch
overhead), and compared with the H200's 4.26 TB/s measured copy bandwidth. Prefill (8 x 2,048 and
1 x 8,192 fresh prompts): time and TFLOP/s of the causal attention for the Triton paged kernel, the
engine's fresh-prompt path (PyTorch's FlashAttention `varlen_attn` over the packed step, see
common/attention/varlen_prefill.py) and PyTorch's SDPA on the same data, by default and pinned to each
of its fused backends, so the table says which kernel SDPA's default is.

    python benchmarks/engine/attention_kernels.py [--sweep-splits] [--skip-decode | --skip-prefill]
                                           [--tune {decode,prefill,all}]

--sweep-splits times fixed split counts next to the heuristic's; --tune sweeps the kernels' tile sizes,
warps and pipeline stages (to pick the defaults in decode_attention.DECODE_LAUNCH / prefill_config).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.engine.attention_setup import (  # noqa: E402
    DTYPE,
    HEAD_DIM,
    NUM_HEADS,
    NUM_KV_HEADS,
    NUM_LAYERS,
    PEAK_TBPS,
    PREFILL_SHAPES,
    decode_meta,
    make_paged,
    packed_step,
    prefill_flops,
    time_graph,
    time_stream,
)
from common.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from common.attention.triton_kernels import decode_attention  # noqa: E402
from common.attention.triton_kernels.prefill_attention import (  # noqa: E402
    paged_prefill_attention,
    prefill_config,
)
from common.attention.varlen_prefill import find_varlen_api, varlen_prefill  # noqa: E402


def bench_decode(batch: int, ctx: int, block_size: int, num_splits: int | None) -> tuple[float, float, int]:
    """(seconds per call, TB/s, splits used) for one decode configuration."""
    k_cache, v_cache, tables = make_paged(batch, ctx, block_size)
    meta = decode_meta(batch, ctx, tables)
    q = torch.randn(batch, NUM_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    backend = TritonAttentionBackend(decode_num_splits=num_splits)
    seconds = time_graph(lambda: backend.decode(q, k_cache, v_cache, meta, HEAD_DIM**-0.5))
    elt = k_cache.element_size()
    kv_bytes = 2 * batch * ctx * NUM_KV_HEADS * HEAD_DIM * elt
    io_bytes = 2 * q.numel() * elt + tables.numel() * 4
    splits = num_splits or _heuristic_splits(batch, ctx)
    return seconds, (kv_bytes + io_bytes) / seconds / 1e12, splits


def _heuristic_splits(batch: int, ctx: int) -> int:
    from common.attention.triton_kernels.decode_plan import choose_num_splits, num_sms

    return choose_num_splits(batch, NUM_KV_HEADS, ctx, num_sms(torch.device("cuda")))


def decode_table(sweep: bool, block_sizes, batches, contexts) -> None:
    print(f"\nDecode (q heads {NUM_HEADS}, kv heads {NUM_KV_HEADS}, head_dim {HEAD_DIM}, bf16)")
    header = ("block", 5), ("batch", 5), ("ctx", 5), ("splits", 6), ("us/layer", 9), ("TB/s", 6), ("%peak", 6)
    print(" ".join(f"{name:>{width}}" for name, width in header), f"{'28L ms':>7}")
    for block_size in block_sizes:
        for batch in batches:
            for ctx in contexts:
                for splits in (None, 1, 2, 4, 8, 16, 32) if sweep else (None,):
                    sec, tbps, used = bench_decode(batch, ctx, block_size, splits)
                    tag = f"{used}{'*' if splits is None else ''}"
                    print(
                        f"{block_size:>5} {batch:>5} {ctx:>5} {tag:>6} {sec * 1e6:>9.1f} {tbps:>6.2f} "
                        f"{100 * tbps / PEAK_TBPS:>5.0f}% {sec * NUM_LAYERS * 1e3:>7.2f}"
                    )
                torch.cuda.empty_cache()
    print(f"(* = heuristic split count; peak = {PEAK_TBPS} TB/s copy bandwidth; 28L = 28 layers)")


def bench_prefill(q: torch.Tensor, num_seqs: int, seq_len: int, block_size: int, config=None) -> float:
    """Seconds per Triton prefill call of `num_seqs` fresh prompts of `seq_len` tokens (paged KV)."""
    k_cache, v_cache, tables = make_paged(num_seqs, seq_len, block_size)
    starts = torch.arange(0, num_seqs + 1, dtype=torch.int32, device="cuda") * seq_len
    seq_lens = torch.full((num_seqs,), seq_len, dtype=torch.int32, device="cuda")
    return time_stream(
        lambda: paged_prefill_attention(
            q, k_cache, v_cache, tables, starts, seq_lens, HEAD_DIM**-0.5, seq_len, config=config
        )
    )


def prefill_rows(num_seqs: int, seq_len: int) -> list[tuple[str, float | str]]:
    """(name, seconds or why not) for each prefill path on one shape."""
    q, k, v, starts = packed_step(num_seqs, seq_len)
    rows: list[tuple[str, float | str]] = []
    for block_size in (16, 256):
        rows.append((f"triton paged, block {block_size}", bench_prefill(q, num_seqs, seq_len, block_size)))
    api = find_varlen_api()
    if api is None:
        rows.append(("varlen_attn (engine fresh path)", f"unavailable in torch {torch.__version__}"))
    else:
        scale = HEAD_DIM**-0.5
        rows.append(
            (
                "varlen_attn (engine fresh path)",
                _timed(lambda: varlen_prefill(api, q, k, v, starts, seq_len, scale)),
            )
        )
    dense = q.view(num_seqs, seq_len, NUM_HEADS, HEAD_DIM).transpose(1, 2)
    k_gqa = k.view(num_seqs, seq_len, NUM_KV_HEADS, HEAD_DIM).transpose(1, 2)
    v_gqa = v.contiguous().view(num_seqs, seq_len, NUM_KV_HEADS, HEAD_DIM).transpose(1, 2)
    k_mha, v_mha = (t.repeat_interleave(NUM_HEADS // NUM_KV_HEADS, dim=1) for t in (k_gqa, v_gqa))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for tag, backend in _sdpa_backends():
        with backend:
            rows.append(
                (
                    f"SDPA {tag}, GQA",
                    _timed(lambda: sdpa(dense, k_gqa, v_gqa, is_causal=True, enable_gqa=True)),
                )
            )
            rows.append(
                (f"SDPA {tag}, k/v heads expanded", _timed(lambda: sdpa(dense, k_mha, v_mha, is_causal=True)))
            )
    return rows


def first_call_ms(num_seqs: int, seq_len: int) -> list[tuple[str, str]]:
    """Wall time of the first call at lengths never seen before (mean of three): what a serving step with
    new prompt lengths pays where a kernel builds a plan per shape (cuDNN SDPA) rather than not at all."""
    api = find_varlen_api()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    calls = {
        "SDPA default, GQA": lambda q, k, v, starts, n: sdpa(
            *(t.view(num_seqs, n, -1, HEAD_DIM).transpose(1, 2) for t in (q, k, v.contiguous())),
            is_causal=True,
            enable_gqa=True,
        ),
    }
    if api is not None:
        calls["varlen_attn"] = lambda q, k, v, starts, n: varlen_prefill(
            api, q, k, v, starts, n, HEAD_DIM**-0.5
        )
    out = []
    for name, call in calls.items():
        times = []
        for extra in (8, 24, 40):
            q, k, v, starts = packed_step(num_seqs, seq_len + extra)
            torch.cuda.synchronize()
            begin = time.perf_counter()
            call(q, k, v, starts, seq_len + extra)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - begin)
        out.append((f"{name}, first call at a new length", f"{1e3 * sum(times) / len(times):.2f} ms wall"))
    return out


def _sdpa_backends():
    """SDPA as it dispatches by default, then pinned to each fused backend (to name what the default runs)."""
    from contextlib import nullcontext

    from torch.nn.attention import SDPBackend, sdpa_kernel

    yield "default", nullcontext()
    for name in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"):
        if hasattr(SDPBackend, name):
            yield name.lower().removesuffix("_attention"), sdpa_kernel([getattr(SDPBackend, name)])


def _timed(fn) -> float | str:
    try:
        return time_stream(fn)
    except Exception as exc:  # a backend that refuses the shape: report and go on
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:60]}"


def prefill_table() -> None:
    print(f"\nPrefill attention (causal, fresh prompts, q heads {NUM_HEADS}, kv heads {NUM_KV_HEADS}, bf16)")
    for num_seqs, seq_len in PREFILL_SHAPES:
        rows = prefill_rows(num_seqs, seq_len)
        flops = prefill_flops(num_seqs, seq_len)
        sdpa = [sec for name, sec in rows if name.startswith("SDPA default") and isinstance(sec, float)]
        ref = min(sdpa) if sdpa else None
        print(f"{num_seqs} x {seq_len}:{'ms':>33} {'TFLOP/s':>8} {'of SDPA':>8}")
        for name, sec in rows:
            if isinstance(sec, str):
                print(f"  {name:<34} {sec}")
                continue
            share = f"{100 * ref / sec:7.0f}%" if ref else ""
            print(f"  {name:<34} {sec * 1e3:6.3f} {flops / sec / 1e12:8.1f} {share}")
        for name, text in first_call_ms(num_seqs, seq_len):
            print(f"  {name:<34} {text}")
        torch.cuda.empty_cache()
    print(
        "(of SDPA = rate relative to the faster SDPA default row; 'expanded' repeats k/v to 16 heads first)"
    )


def tune_decode() -> None:
    print("\nDecode tuning (block 16, heuristic splits): TB/s per decode-kernel launch configuration")
    workloads = [(64, 1024), (64, 4096), (256, 1024), (256, 4096)]
    print(
        f"{'tile_bytes':>10} {'warps':>5} {'stages':>6} "
        + " ".join(f"{f'b{b}/c{c}':>10}" for b, c in workloads)
    )
    default = dict(decode_attention.DECODE_LAUNCH)
    for tile_bytes in (8192, 16384, 32768):
        for warps in (4, 8):
            for stages in (2, 3, 4):
                decode_attention.DECODE_LAUNCH.update(
                    tile_bytes=tile_bytes, num_warps=warps, num_stages=stages
                )
                try:
                    rates = [f"{bench_decode(b, c, 16, None)[1]:>10.2f}" for b, c in workloads]
                except Exception as exc:  # out of shared memory etc.: report and go on
                    rates = [f"{type(exc).__name__:>10}"]
                print(f"{tile_bytes:>10} {warps:>5} {stages:>6} " + " ".join(rates))
                torch.cuda.empty_cache()
    decode_attention.DECODE_LAUNCH.update(default)


def tune_prefill() -> None:
    configs = [
        (64, 32, 4, 2), (64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 4, 4), (64, 64, 8, 2), (64, 64, 8, 3),
        (64, 128, 4, 2), (64, 128, 8, 2), (32, 64, 4, 2), (128, 32, 4, 2), (128, 32, 8, 3), (128, 64, 4, 2),
        (128, 64, 8, 2), (128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2), (128, 128, 8, 3),
    ]  # fmt: skip
    for num_seqs, seq_len in PREFILL_SHAPES:
        print(f"\nPrefill tuning ({num_seqs} x {seq_len}, block 16, Triton paged kernel): TFLOP/s by config")
        flops = prefill_flops(num_seqs, seq_len)
        q = torch.randn(num_seqs * seq_len, NUM_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
        default = prefill_config(HEAD_DIM, q.element_size(), seq_len)
        for block_m, block_n, warps, stages in configs:
            cfg = {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps, "num_stages": stages}
            try:
                rate = f"{flops / bench_prefill(q, num_seqs, seq_len, 16, cfg) / 1e12:6.1f}"
            except Exception as exc:  # out of shared memory etc.: report and go on
                rate = type(exc).__name__
            mark = "  (default)" if cfg == default else ""
            print(f"  BLOCK_M {block_m:>3} BLOCK_N {block_n:>3} warps {warps} stages {stages}: {rate}{mark}")
        torch.cuda.empty_cache()


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep-splits", action="store_true", help="also time fixed split counts")
    parser.add_argument("--skip-prefill", action="store_true")
    parser.add_argument("--skip-decode", action="store_true")
    parser.add_argument("--tune", choices=["decode", "prefill", "all"], help="sweep launch configurations")
    parser.add_argument("--block-sizes", type=_ints, default=[16, 256], help="e.g. 16,256")
    parser.add_argument("--batches", type=_ints, default=[64, 256], help="decode batch sizes, e.g. 64,256")
    parser.add_argument("--contexts", type=_ints, default=[1024, 4096], help="decode context lengths")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    if not args.skip_decode:
        decode_table(args.sweep_splits, args.block_sizes, args.batches, args.contexts)
    if not args.skip_prefill:
        prefill_table()
    if args.tune in ("decode", "all"):
        tune_decode()
    if args.tune in ("prefill", "all"):
        tune_prefill()


if __name__ == "__main__":
    main()
