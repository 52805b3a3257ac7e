"""Chooses fused Triton kernels on CUDA and eager PyTorch elsewhere (the CPU never imports Triton).

`PDSERVE_DISABLE_FUSED=1` forces the eager path everywhere, for A/B benchmarks and debugging.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch


@functools.cache
def _triton_usable() -> bool:
    if os.environ.get("PDSERVE_DISABLE_FUSED") == "1":
        return False
    return torch.cuda.is_available() and importlib.util.find_spec("triton") is not None


def use_fused(x: torch.Tensor) -> bool:
    return x.is_cuda and _triton_usable()


def ops():
    """The Triton kernels module (call only after `use_fused` said yes)."""
    from common.layers import triton_ops

    return triton_ops
