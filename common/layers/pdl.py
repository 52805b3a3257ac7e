"""Programmatic dependent launch (PDL) for the decode path's Triton kernels (`PDSERVE_PDL`).

A kernel launched with `launch_pdl=True` may start while the kernel before it in the stream is still
running, so its launch and setup overlap that kernel's tail instead of following it (a CUDA graph
captures such launches as programmatic edges; CUDA 12.3+, compute capability 9.0+). The contract
every kernel launched that way keeps:

* before `pdl_wait` it reads only memory no kernel writes (weights), and writes nothing: the
  previous kernel may still be reading or writing anything else (activations, the KV cache, the
  arrival counters, buffers the caching allocator handed over);
* `pdl_wait` returns once the previous kernel has finished and its writes are visible; it then lets
  the next kernel's programs launch, which wait in their turn. A kernel of a few programs may call
  `pdl_launch_next_then_wait` instead, so the next kernel launches while this one still waits: the next
  kernel's own wait returns only once this one has finished, which is after this one's predecessor.

A kernel launches only once every program of the kernel before it has started (a grid's trigger counts
all its programs), so a program that waits never waits on one that has no SM yet: no chain deadlocks.

`PDSERVE_PDL`: `auto` (the default) uses it on CUDA GPUs of compute capability 9.0 or newer, `0` never,
`1` always (an error where it cannot work). Measured on one H200 (docs/benchmarks.md): batch-1 decode
0.889 against 1.042 ms per token without it, in the same run; on the default model (SmolLM2-135M,
issue 27) 0.615-0.621 against 0.731-0.739 ms at batch 1, but 1.469-1.472 against 1.447-1.459 ms at
64 rows (PDL costs ~1.5% there, in both rounds): kept on, a per-batch-size choice is left open.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from common.env_flags import env_choice

_MODES = ("auto", "0", "1")


@functools.cache
def _flag() -> str:
    return env_choice("PDSERVE_PDL", _MODES, "auto")


@functools.cache
def _capable(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def pdl_enabled(device: torch.device) -> bool:
    """Whether kernels on `device` launch with PDL (`PDSERVE_PDL`, read once); ValueError where
    PDSERVE_PDL=1 cannot work (CPU, interpreter, GPUs before Hopper)."""
    mode = _flag()
    if mode == "0":
        return False
    if _capable(device):
        return True
    if mode == "1":
        raise ValueError(f"PDSERVE_PDL=1 needs a CUDA GPU of compute capability 9.0 or newer, not {device}")
    return False


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """With PDL: wait until the previous kernel has finished (its writes visible), then let the next
    kernel launch. Without PDL: nothing (stream order already serialises the kernels)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def pdl_launch_next_then_wait(PDL: tl.constexpr):
    """With PDL: let the next kernel launch now, then wait as `pdl_wait` does. For kernels of a few
    programs (a one-row norm, the q/k/v rope store, batch-1 attention), whose successor then loads its
    first weight tiles during this kernel's wait and run instead of after them. Without PDL: nothing."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
