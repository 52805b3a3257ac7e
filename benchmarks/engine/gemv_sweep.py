"""Few-row projections of large weights: the streaming GEMV kernel against cuBLAS (GPU only).

python benchmarks/engine/gemv_sweep.py [--models qwen3-8b] [--rows 1 2 4] [--sweep] [--quick] [--stages 2 3 4]

Per projection of the model shape and row count: cuBLAS (`F.linear`, + SiLU*mul for gate/up) and
`common/layers/triton_gemv.gemv` at its default launch
or, with `--sweep`, at every launch of the grid below (the best is printed). Each case is timed
inside a CUDA graph over weight copies larger than L2 (as skinny_gemm.py does), so the weights come
from HBM and consecutive calls overlap as a model's kernels do under PDL. The first line is the read
ceiling: a Triton kernel that only sums 1 GiB, and a device-to-device copy of 1 GiB (read + written).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from benchmarks.engine.skinny_gemm import SHAPES, _time_us  # noqa: E402
from benchmarks.engine.skinny_gemm import projections as skinny_projections  # noqa: E402
from common.layers import triton_ops  # noqa: E402
from common.layers.triton_gemv import GemvLaunch, gemv, launch_for  # noqa: E402

_COLD_BYTES = 512 << 20


def projections(model: str) -> list[tuple[str, int, int, bool]]:
    """(name, weight rows, inner dim, silu_mul) per projection (skinny_gemm.py's, without the norm the
    skinny kernel fuses), the LM head last."""
    layers = [(name.replace("+norm", ""), n, k, mlp) for name, n, k, mlp in skinny_projections(model)]
    return [*layers, ("lm_head", 151_936, SHAPES[model][0], False)]  # Qwen3's vocabulary


@triton.jit
def _read_kernel(src, out, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(src + offs, eviction_policy="evict_first").to(tl.float32)
    tl.store(out + tl.program_id(0), tl.sum(v, axis=0))


def read_ceiling() -> tuple[float, float]:
    """(TB/s of a read-only Triton kernel, TB/s of a copy counted read + written) over 1 GiB."""
    src = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    block = 8192
    out = torch.empty(src.numel() // block, dtype=torch.float32, device="cuda")
    read_us = _time_us(lambda i: _read_kernel[(out.numel(),)](src, out, BLOCK=block, num_warps=8), 1)
    copy_us = _time_us(lambda i: dst.copy_(src), 1)
    return src.nbytes / read_us / 1e6, 2 * src.nbytes / copy_us / 1e6


def case(n: int, k: int, silu: bool, rows: int):
    """(cuBLAS fn, gemv fn factory, calls, weight bytes) for one [n, k] projection at `rows` rows."""
    nbytes = n * k * 2
    copies = max(2, _COLD_BYTES // nbytes)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5 for _ in range(copies)]
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)

    def cublas(i):
        out = F.linear(x, ws[i % copies])
        return triton_ops.silu_and_mul(out) if silu else out

    def ours(launch):
        return lambda i: gemv(x, ws[i % copies], silu_mul=silu, launch=launch)

    ref = cublas(0).float()
    got = ours(None)(0).float()
    err = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
    if err > 0.02:
        where = f"{rows} x [{n}, {k}] silu={silu}"
        raise SystemExit(f"gemv disagrees with cuBLAS on {where}: relative error {err:.4f}")
    return cublas, ours, copies, nbytes


def grid(k: int, quick: bool, stages_grid: tuple[int, ...] = (2,)):
    tiles = [(4, 1024), (8, 1024), (4, 2048), (8, 2048), (16, 512), (2, 4096), (4, 4096)]
    splits = (0,) if quick else (1, 2, 4, 8)
    for (bn, bk), split, warps, stages in itertools.product(tiles, splits, (4, 8), stages_grid):
        if split and k // split < bk:
            continue
        yield GemvLaunch(bn, bk, split, warps, stages)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["qwen3-8b"], choices=sorted(SHAPES))
    p.add_argument("--rows", type=int, nargs="+", default=[1], help="rows per step (1 to MAX_ROWS)")
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--quick", action="store_true", help="with --sweep: the split chosen from the shape only")
    p.add_argument(
        "--stages",
        type=int,
        nargs="+",
        default=[2],
        help="with --sweep: pipeline stages to try (more bytes"
        " in flight per program, which a faster memory may want)",
    )
    args = p.parse_args()
    read, copy = read_ceiling()
    print(f"read ceiling: {read:.2f} TB/s (Triton sum over 1 GiB); copy {copy:.2f} TB/s (read + written)")
    print("| model | rows | projection | weight MB | cuBLAS us | TB/s | gemv us | TB/s | speedup | launch |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for model, rows in itertools.product(args.models, args.rows):
        for name, n, k, silu in projections(model):
            cublas, ours, calls, nbytes = case(n, k, silu, rows)
            best, best_us = launch_for(silu), _time_us(ours(None), calls)
            for launch in grid(k, args.quick, tuple(args.stages)) if args.sweep and name != "lm_head" else ():
                try:
                    us = _time_us(ours(launch), calls)
                except Exception as exc:  # a launch the compiler rejects (registers, shared memory)
                    print(f"  {launch}: {type(exc).__name__}", file=sys.stderr)
                    continue
                if us < best_us:
                    best, best_us = launch, us
            c_us = _time_us(cublas, calls)
            print(
                f"| {model} | {rows} | {name} | {nbytes / 1e6:.1f} | {c_us:.2f} | "
                f"{nbytes / c_us / 1e6:.2f} | "
                f"{best_us:.2f} | {nbytes / best_us / 1e6:.2f} | {c_us / best_us:.2f}x | {best} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
