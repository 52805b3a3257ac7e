"""Copy blocks from one cache into another in one pass: `dst[:, :, d_i] = src[:, :, s_i]` for every pair.

A gather (`index_select`) then a scatter (`index_copy_`) reads the blocks twice and writes them twice,
through a temporary as large as the whole hand-over. On CUDA one Triton kernel instead moves every
(k/v plane, block) pair straight from the source to the destination, which is what lets an ipc hand-over
run near the device-to-device copy rate (the source may be another process's cache, mapped through CUDA
IPC, on this GPU or a peer). On the CPU the gather/scatter pair is what exists.

Both caches follow the cache contract (`[2, num_layers, num_blocks, block_size, num_kv_heads, head_dim]`,
contiguous) with the same layout but any number of blocks.
"""

from __future__ import annotations

import torch

from .layout import flat_view, gather, scatter

_kernel = None  # built on first CUDA use: Triton is a GPU-only dependency


def copy_blocks(src: torch.Tensor, dst: torch.Tensor, src_ids: torch.Tensor, dst_ids: torch.Tensor) -> None:
    """Copy blocks `src_ids` of `src` into blocks `dst_ids` of `dst` (long tensors on `dst`'s device, same
    length, dst ids distinct). Runs on the current stream; asynchronous on CUDA."""
    if src_ids.numel() != dst_ids.numel():
        raise ValueError(f"src_ids ({src_ids.numel()}) and dst_ids ({dst_ids.numel()}) differ in length")
    if src_ids.numel() == 0:
        return
    if not dst.is_cuda:
        scatter(dst, dst_ids, gather(src, src_ids))
        return
    s, d = flat_view(src), flat_view(dst)
    block_bytes = s.shape[2] * s.element_size()
    word = torch.int32 if block_bytes % 4 == 0 else torch.uint8  # dtype-agnostic: move raw words
    s, d = s.view(word), d.view(word)
    elems = s.shape[2]
    chunk = min(_next_pow2(elems), 2048)
    grid = (src_ids.numel(), s.shape[0])
    _get_kernel()[grid](s, d, src_ids, dst_ids, s.stride(0), d.stride(0), elems, chunk, num_warps=4)


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _get_kernel():
    global _kernel
    if _kernel is None:
        import triton
        import triton.language as tl

        @triton.jit
        def _copy(src, dst, src_ids, dst_ids, src_plane, dst_plane, ELEMS: tl.constexpr, CHUNK: tl.constexpr):
            pair = tl.program_id(0)
            plane = tl.program_id(1).to(tl.int64)
            s = tl.load(src_ids + pair).to(tl.int64)
            d = tl.load(dst_ids + pair).to(tl.int64)
            src_base = src + plane * src_plane + s * ELEMS
            dst_base = dst + plane * dst_plane + d * ELEMS
            for first in tl.static_range(0, ELEMS, CHUNK):
                offs = first + tl.arange(0, CHUNK)
                mask = offs < ELEMS
                tl.store(dst_base + offs, tl.load(src_base + offs, mask=mask), mask=mask)

        _kernel = _copy
    return _kernel
