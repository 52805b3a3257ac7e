"""Programmatic dependent launch (PDL) for the decode path's Triton kernels, behind `PDSERVE_PDL=1`.

A kernel launched with `launch_pdl=True` may start while the kernel before it in the stream is still
running, so its launch and setup overlap that kernel's tail instead of following it (a CUDA graph
captures such launches as programmatic edges; CUDA 12.3+, compute capability 9.0+). The contract
every kernel launched that way keeps:

* before `pdl_wait` it reads only memory no kernel writes (weights), and writes nothing: the
  previous kernel may still be reading or writing anything else (activations, the KV cache, the
  arrival counters, buffers the caching allocator handed over);
* `pdl_wait` returns once the previous kernel has finished and its writes are visible; it then lets
  the next kernel's programs launch, which wait in their turn.

Off by default: the gain (launch latency hidden per kernel boundary) is to be measured on the GPU.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl


@functools.cache
def _flag() -> bool:
    value = os.environ.get("PDSERVE_PDL", "0")
    if value not in ("0", "1"):
        raise ValueError(f"PDSERVE_PDL must be 0 or 1, got {value!r}")
    return value == "1"


@functools.cache
def _capable(device: torch.device) -> bool:
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 9:
        raise ValueError(f"PDSERVE_PDL=1 needs a CUDA GPU of compute capability 9.0 or newer, not {device}")
    return True


def pdl_enabled(device: torch.device) -> bool:
    """Whether kernels on `device` launch with PDL (`PDSERVE_PDL`, read once); ValueError where
    PDSERVE_PDL=1 cannot work (CPU, interpreter, GPUs before Hopper)."""
    return _flag() and _capable(device)


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """With PDL: wait until the previous kernel has finished (its writes visible), then let the next
    kernel launch. Without PDL: nothing (stream order already serialises the kernels)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
