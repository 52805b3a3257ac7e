"""Decode-sized projections: the skinny Triton kernels against cuBLAS, per layer shape (GPU only).

python benchmarks/engine/skinny_gemm.py [--models qwen3-0.6b smollm2-135m] [--rows 1 8 16] [--sweep]

Each case is timed inside a CUDA graph (one replay calls it once per weight copy, the copies together
larger than the L2 cache, so weights come from HBM as in a model's step), so launch cost is out and
what is left is what a decode graph pays. "unfused" is what the layer ran before: add+RMSNorm,
F.linear (cuBLAS), SiLU*mul where the projection is gate/up. `--sweep` tries every launch shape at
each row count and prints the best per shape (what `triton_skinny.launch_for` should pick).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from common.layers import triton_ops  # noqa: E402
from common.layers.triton_skinny import SkinnyLaunch, launch_for, skinny_linear  # noqa: E402

# (hidden, q heads * head_dim, kv heads * head_dim, intermediate) of each architecture.
SHAPES = {
    "qwen3-0.6b": (1024, 2048, 1024, 3072),
    "smollm2-135m": (576, 576, 192, 1536),
    "qwen3-8b": (4096, 4096, 1024, 12288),
}
_COLD_BYTES = 256 << 20  # weight copies per case: more than the H200's 50 MB of L2, many times over


def _time_us(fn, calls: int) -> float:
    fn(0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    end.synchronize()
    return 1e3 * start.elapsed_time(end) / (5 * calls)


def projections(model: str) -> list[tuple[str, int, int, bool]]:
    """(name, output rows of the weight, inner dim, gate/up with norm prologue?) per projection."""
    hidden, q, kv, inter = SHAPES[model]
    return [
        ("qkv+norm", q + 2 * kv, hidden, False),
        ("o_proj", hidden, q, False),
        ("gate_up+norm+silu", 2 * inter, hidden, True),
        ("down", hidden, inter, False),
    ]


def case(name: str, n: int, k: int, mlp: bool, rows: int, launch: SkinnyLaunch | None):
    """(fused fn, unfused fn, calls, weight bytes) for one projection at `rows` rows; fn(i) uses the
    i-th copy of the weight."""
    dev, dt = "cuda", torch.bfloat16
    nbytes = n * k * 2
    copies = max(8, _COLD_BYTES // nbytes)
    ws = [torch.randn(n, k, device=dev, dtype=dt) * k**-0.5 for _ in range(copies)]
    x = torch.randn(rows, k, device=dev, dtype=dt)
    res = torch.randn(rows, k, device=dev, dtype=dt)
    g = torch.ones(k, device=dev, dtype=dt)
    normed = "norm" in name
    if normed:

        def fused(i):
            w = ws[i % copies]
            return skinny_linear(x, w, residual=res, norm_weight=g, eps=1e-6, silu_mul=mlp, launch=launch)

        def unfused(i):
            h, _ = triton_ops.rmsnorm(x, g, 1e-6, res)
            out = F.linear(h, ws[i % copies])
            return triton_ops.silu_and_mul(out) if mlp else out
    else:

        def fused(i):
            return skinny_linear(x, ws[i % copies], launch=launch)

        def unfused(i):
            return F.linear(x, ws[i % copies])

    return fused, unfused, copies, nbytes


def sweep(n: int, k: int, mlp: bool, name: str, rows: int) -> tuple[SkinnyLaunch, float]:
    best = (SkinnyLaunch(), float("inf"))
    few = rows <= 4  # the multiply-add path: narrower, longer tiles
    grid = (
        itertools.product((8, 16, 32), (256, 512, 1024), (4, 8))
        if few
        else itertools.product((16, 32, 64), (128, 256), (4,))
    )
    for bn, bk, warps in grid:
        launch = SkinnyLaunch(bn, bk, warps, 3)
        try:
            fused, _, calls, _ = case(name, n, k, mlp, rows, launch)
            us = _time_us(fused, calls)
        except Exception as exc:  # a shape the compiler rejects (shared memory) is skipped
            print(f"  {launch}: {type(exc).__name__}")
            continue
        if us < best[1]:
            best = (launch, us)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["qwen3-0.6b", "smollm2-135m"], choices=sorted(SHAPES))
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16])
    p.add_argument("--sweep", action="store_true")
    args = p.parse_args()
    print("| model | projection | rows | weight MB | unfused us | skinny us | speedup | TB/s | launch |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for model in args.models:
        for name, n, k, mlp in projections(model):
            for rows in args.rows:
                launch = sweep(n, k, mlp, name, rows)[0] if args.sweep else None
                fused, unfused, calls, nbytes = case(name, n, k, mlp, rows, launch)
                f_us, u_us = _time_us(fused, calls), _time_us(unfused, calls)
                shown = launch or launch_for(n // 2 if mlp else n, k, rows)
                print(
                    f"| {model} | {name} | {rows} | {nbytes / 1e6:.1f} | {u_us:.2f} | {f_us:.2f} | "
                    f"{u_us / f_us:.2f}x | {nbytes / f_us / 1e6:.2f} | {shown} |"
                )


if __name__ == "__main__":
    main()
