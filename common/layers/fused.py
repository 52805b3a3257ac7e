"""Chooses fused Triton kernels on CUDA and eager PyTorch elsewhere (the CPU never imports Triton).

`PDSERVE_DISABLE_FUSED=1` forces the eager path everywhere, for A/B benchmarks and debugging;
`PDSERVE_DISABLE_SKINNY=1` keeps the other fused kernels but runs decode-sized projections on cuBLAS;
`PDSERVE_SKINNY_MAX_ROWS=N` (1-16, default `SKINNY_MAX_ROWS`) sends steps of up to N rows to the
skinny kernels, for A/B runs on other model shapes; `PDSERVE_DISABLE_GEMV=1` runs few-row projections
of large weights on cuBLAS instead of the streaming GEMV kernel, and `PDSERVE_GEMV_MAX_ROWS=N` (1 to
`GEMV_ROWS_LIMIT`, default `GEMV_MAX_ROWS`) sends steps of up to N rows to it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import threading
from collections.abc import Iterator

import torch

from common.env_flags import env_int, env_switch


@functools.cache
def _triton_usable() -> bool:
    if env_switch("PDSERVE_DISABLE_FUSED", default=False):
        return False
    return torch.cuda.is_available() and importlib.util.find_spec("triton") is not None


def use_fused(x: torch.Tensor) -> bool:
    return x.is_cuda and _triton_usable()


# Rows per step up to which projections run as skinny Triton kernels with their neighbouring norm and
# activation fused in (common/layers/triton_skinny.py). Measured on the H200 (benchmarks/
# kernel_profile.py, Qwen3-0.6B shapes): a batch-1 decode step replays in 0.92 ms against 1.24 ms on
# cuBLAS; from 2 rows on cuBLAS's tiles are as fast or faster and the skinny path loses 5-20%. On the
# default model (SmolLM2-135M, issue 27, benchmarks/engine/latency.py) batch-1 decode at 1k context takes
# 0.615-0.621 ms against 0.985 ms with PDSERVE_DISABLE_SKINNY=1; 64 rows are unaffected (within 1%).
SKINNY_MAX_ROWS = 1

# Largest weight (bytes, per rank) a skinny projection reads. The skinny kernel wins where weights are small
# and launch overhead and fusion matter; larger weights in steps of up to GEMV_MAX_ROWS rows go to the
# streaming GEMV kernel (`use_gemv`), at more rows to cuBLAS. Measured at one row on the H200
# (`benchmarks/engine/skinny_gemm.py --sweep --rows 1`, each against norm + cuBLAS + SiLU): Qwen3-0.6B's
# projections (4-12.6 MB) 1.16-3.02x faster on the skinny kernel; Qwen3-8B's (33.6-201 MB) 0.87-0.97x, even
# at the sweep's best launch (2026-12-03, aff2219). A decoder layer takes its fused skinny path (norms
# inside the projections) by its largest projection (gate/up); a projection called on its own decides by its
# own weight.
SKINNY_MAX_WEIGHT_BYTES = 16 << 20

# Rows the streaming GEMV kernel can take in one launch (common/layers/triton_gemv.py multiplies each
# weight tile with every row in turn), and the rows per step up to which it is used by default. On the
# Qwen3-8B shape (H100, 2026-12-05, benchmarks/engine/floors.py --batches 1 2 4, PDSERVE_GEMV_MAX_ROWS 4
# against 1, two rounds): batch 2 decodes in 6.068 ms against cuBLAS's 6.43 (0.944x), batch 1 as
# before, but batch 4 takes 8.0 ms against 6.67 at the default launch (the per-row products, not the
# reads, bound it there), so 3-4 rows stay opt-in. Models whose weights all fit the skinny kernels
# (the default model, Qwen3-0.6B) never take this kernel.
GEMV_ROWS_LIMIT = 4
GEMV_MAX_ROWS = 2


_side = threading.local()


@contextlib.contextmanager
def beside_the_engine_stream() -> Iterator[None]:
    """Projections launched inside run on a side stream at the same time as the engine stream's
    (a multiplexed prefill chunk, common/runner/side_launch.py). The skinny and GEMV kernels merge
    their split parts through arrival counters shared by every launch on a device, which two
    launches at once would corrupt, so here one-row projections (a prompt whose prefix was all
    cached leaves one row) take cuBLAS."""
    _side.depth = getattr(_side, "depth", 0) + 1
    try:
        yield
    finally:
        _side.depth -= 1


def _on_engine_stream() -> bool:
    return not getattr(_side, "depth", 0)


@functools.cache
def _skinny_enabled() -> bool:
    return not env_switch("PDSERVE_DISABLE_SKINNY", default=False)


@functools.cache
def skinny_max_rows() -> int:
    """`PDSERVE_SKINNY_MAX_ROWS` when set (validated: the kernel takes 1 to 16 rows), else SKINNY_MAX_ROWS."""
    return env_int("PDSERVE_SKINNY_MAX_ROWS", SKINNY_MAX_ROWS, low=1, high=16)


def use_skinny(x: torch.Tensor, weight_bytes: int) -> bool:
    """A decode-sized 2-d activation on CUDA times a weight of at most SKINNY_MAX_WEIGHT_BYTES: the
    projection takes the skinny kernels."""
    return (
        x.dim() == 2
        and x.shape[0] <= skinny_max_rows()
        and weight_bytes <= SKINNY_MAX_WEIGHT_BYTES
        and use_fused(x)
        and _skinny_enabled()
        and _on_engine_stream()
    )


@functools.cache
def gemv_enabled() -> bool:
    """False under `PDSERVE_DISABLE_GEMV=1` (read once)."""
    return not env_switch("PDSERVE_DISABLE_GEMV", default=False)


@functools.cache
def gemv_max_rows() -> int:
    """`PDSERVE_GEMV_MAX_ROWS` when set (validated against the kernel's GEMV_ROWS_LIMIT), else GEMV_MAX_ROWS;
    0 under `PDSERVE_DISABLE_GEMV=1`."""
    if not gemv_enabled():
        return 0
    return env_int("PDSERVE_GEMV_MAX_ROWS", GEMV_MAX_ROWS, low=1, high=GEMV_ROWS_LIMIT)


def use_gemv(x: torch.Tensor, weight_bytes: int) -> bool:
    """A step of up to `gemv_max_rows()` rows on CUDA times a weight too large for the skinny kernels:
    the projection takes the streaming GEMV kernel (common/layers/triton_gemv.py), which reads such
    weights faster than cuBLAS and starts its reads before the kernel ahead of it ends."""
    return (
        x.dim() == 2
        and x.shape[0] <= gemv_max_rows()
        and weight_bytes > SKINNY_MAX_WEIGHT_BYTES
        and use_fused(x)
        and _on_engine_stream()
    )


# Smallest LM head (bytes, per rank) that takes the streaming GEMV in steps `use_gemv` sends it. Measured
# on one H100 (2026-12-07, benchmarks/engine/latency.py, two rounds alternated with cuBLAS): the Qwen3-8B
# shape's 1.24 GB head made batch-1 decode 5.473 against 5.499 ms; the default model's 56 MB head 0.614
# against 0.611 ms (no gain). Between the two nothing was measured; the line sits where 8B-class heads
# (1.05-1.24 GB) take it and Qwen3-0.6B's 311 MB head does not.
LM_HEAD_GEMV_MIN_BYTES = 512 << 20


def use_lm_head_gemv(x: torch.Tensor, weight_bytes: int) -> bool:
    """The LM head's rule: `use_gemv`, for heads of LM_HEAD_GEMV_MIN_BYTES or more."""
    return weight_bytes >= LM_HEAD_GEMV_MIN_BYTES and use_gemv(x, weight_bytes)


def gemv():
    """The streaming GEMV kernel (call only after `use_gemv` said yes)."""
    from common.layers import triton_gemv

    return triton_gemv


def skinny():
    """The skinny projection kernels (call only after `use_skinny` said yes)."""
    from common.layers import triton_skinny

    return triton_skinny


def ops():
    """The Triton kernels module (call only after `use_fused` said yes)."""
    from common.layers import triton_ops

    return triton_ops
