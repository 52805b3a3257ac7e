"""Move blocks between caches in one pass, optionally checksumming what moved: `dst[:, :, d_i] =
src[:, :, s_i]` for every pair, and `sums[i] += checksum(block moved by pair i)`.

A gather (`index_select`) then a scatter (`index_copy_`) reads the blocks twice and writes them twice,
through a temporary as large as the whole hand-over. On CUDA one Triton kernel instead moves every
(k/v plane, block) pair straight from the source to the destination, which is what lets an ipc hand-over
run near the device-to-device copy rate (the source may be another process's cache, mapped through CUDA
IPC, on this GPU or a peer). The same kernel folds in verification (`verify.py`): each program sums the
words it moved, weights its plane's sum and adds it to its block's entry of `sums` with one atomic add,
so a checked copy reads every byte exactly once, like an unchecked one. Callers that compare start
`sums` at the negated expected sums: a block whose bytes match ends at 0. With nothing to copy
(`checksum_blocks`) the kernel only reads. On the CPU the gather/scatter pair and `block_checksums` do
the same work.

Both caches follow the cache contract (`[2, num_layers, num_blocks, block_size, num_kv_heads, head_dim]`,
contiguous) with the same layout but any number of blocks; `blocks` buffers are `[2 * num_layers, n,
block_elems]`, contiguous (what `layout.gather` returns).
"""

from __future__ import annotations

import torch

from .layout import flat_view, gather, scatter
from .verify import block_checksums, checksum_word

_kernel = None  # built on first use: Triton is a GPU-only dependency


def copy_blocks(
    src: torch.Tensor,
    dst: torch.Tensor,
    src_ids: torch.Tensor,
    dst_ids: torch.Tensor,
    sums: torch.Tensor | None = None,
) -> None:
    """Copy blocks `src_ids` of `src` into blocks `dst_ids` of `dst` (long tensors on `dst`'s device, same
    length, dst ids distinct); with `sums` (int64, one per pair, on `dst`'s device) add each moved block's
    checksum to its entry. Runs on the current stream; asynchronous on CUDA."""
    if src_ids.numel() != dst_ids.numel():
        raise ValueError(f"src_ids ({src_ids.numel()}) and dst_ids ({dst_ids.numel()}) differ in length")
    _check_sums(sums, src_ids.numel())
    if src_ids.numel() == 0:
        return
    if _uses_kernel(dst):
        _launch(flat_view(src), flat_view(dst), src_ids, dst_ids, sums, src_ids.numel())
        return
    blocks = gather(src, src_ids)
    scatter(dst, dst_ids, blocks)
    _add_checksums(sums, blocks)


def gather_blocks(cache: torch.Tensor, ids: torch.Tensor, sums: torch.Tensor | None = None) -> torch.Tensor:
    """Blocks `ids` of `cache` as one new contiguous [2 * num_layers, n, block_elems] tensor, adding
    their checksums to `sums` if given (as `copy_blocks`). Without sums this is torch's gather: the
    kernel earns its place here by summing in the same pass."""
    _check_sums(sums, ids.numel())
    if sums is None or not _uses_kernel(cache) or ids.numel() == 0:
        blocks = gather(cache, ids)
        _add_checksums(sums, blocks)
        return blocks
    flat = flat_view(cache)
    blocks = torch.empty(flat.shape[0], ids.numel(), flat.shape[2], dtype=cache.dtype, device=cache.device)
    _launch(flat, blocks, ids, None, sums, ids.numel())
    return blocks


def scatter_blocks(
    cache: torch.Tensor, ids: torch.Tensor, blocks: torch.Tensor, sums: torch.Tensor | None = None
) -> None:
    """Write `blocks` ([2 * num_layers, n, block_elems], contiguous) into blocks `ids` of `cache`, adding
    their checksums to `sums` if given (as `copy_blocks`; without sums, torch's scatter)."""
    _check_sums(sums, ids.numel())
    if sums is None or not _uses_kernel(cache) or ids.numel() == 0:
        scatter(cache, ids, blocks)
        _add_checksums(sums, blocks)
        return
    _launch(blocks, flat_view(cache), None, ids, sums, ids.numel())


def checksum_blocks(cache: torch.Tensor, ids: torch.Tensor, group: int = 64) -> torch.Tensor:
    """`verify.block_checksums` of blocks `ids` of `cache` (a new int64 tensor on the cache's device),
    reading each byte once; asynchronous on CUDA. On the CPU the blocks are gathered `group` at a time,
    so the temporary stays small whatever the hand-over's size."""
    sums = torch.zeros(ids.numel(), dtype=torch.int64, device=cache.device)
    if _uses_kernel(cache) and ids.numel():
        _launch(flat_view(cache), None, ids, None, sums, ids.numel())
        return sums
    for i in range(0, ids.numel(), group):
        sums[i : i + group] += block_checksums(gather(cache, ids[i : i + group]))
    return sums


def _uses_kernel(t: torch.Tensor) -> bool:
    """Whether `t`'s blocks move through the Triton kernel (tests point this at the interpreter)."""
    return t.is_cuda


def _check_sums(sums: torch.Tensor | None, n: int) -> None:
    if sums is not None and (sums.dtype != torch.int64 or sums.shape != (n,) or not sums.is_contiguous()):
        raise ValueError(
            f"sums must be a contiguous int64 tensor of {n} entries, got {sums.dtype} {sums.shape}"
        )


def _add_checksums(sums: torch.Tensor | None, blocks: torch.Tensor) -> None:
    if sums is not None and blocks.shape[1]:
        sums += block_checksums(blocks)


def _launch(
    src: torch.Tensor,
    dst: torch.Tensor | None,
    src_ids: torch.Tensor | None,
    dst_ids: torch.Tensor | None,
    sums: torch.Tensor | None,
    n: int,
) -> None:
    """One kernel, one program per (pair, plane) of `n` pairs. `src`/`dst` are flat [planes, blocks,
    elems] views; ids None means the buffer's own block order (0..n-1); `dst` None: read only."""
    word = checksum_word(src.shape[2] * src.element_size())  # the copy moves the words it sums
    s = src.view(word)
    d = s if dst is None else dst.view(word)
    elems = s.shape[2]
    chunk = min(_next_pow2(elems), 2048 if word == torch.uint8 else 1024)
    _get_kernel()[(n, s.shape[0])](
        s,
        d,
        s if src_ids is None else src_ids,
        s if dst_ids is None else dst_ids,
        s if sums is None else sums,
        s.stride(0),
        d.stride(0),
        ELEMS=elems,
        CHUNK=chunk,
        SRC_IDS=src_ids is not None,
        DST_IDS=dst_ids is not None,
        COPY=dst is not None,
        SUM=sums is not None,
        num_warps=4,
    )


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _get_kernel():
    global _kernel
    if _kernel is None:
        import triton
        import triton.language as tl

        @triton.jit
        def _move(
            src,
            dst,
            src_ids,
            dst_ids,
            sums,
            src_plane,
            dst_plane,
            ELEMS: tl.constexpr,
            CHUNK: tl.constexpr,
            SRC_IDS: tl.constexpr,
            DST_IDS: tl.constexpr,
            COPY: tl.constexpr,
            SUM: tl.constexpr,
        ):
            pair = tl.program_id(0).to(tl.int64)
            plane = tl.program_id(1).to(tl.int64)
            s = tl.load(src_ids + pair).to(tl.int64) if SRC_IDS else pair
            d = tl.load(dst_ids + pair).to(tl.int64) if DST_IDS else pair
            src_base = src + plane * src_plane + s * ELEMS
            dst_base = dst + plane * dst_plane + d * ELEMS
            acc = tl.zeros([CHUNK], dtype=tl.int64)
            for first in tl.static_range(0, ELEMS, CHUNK):
                offs = first + tl.arange(0, CHUNK)
                mask = offs < ELEMS
                words = tl.load(src_base + offs, mask=mask, other=0)
                if COPY:
                    tl.store(dst_base + offs, words, mask=mask)
                if SUM:
                    acc += words.to(tl.int64)  # uint8 words widen unsigned, as verify's torch form does
            if SUM:
                # Integer adds wrap, so the order the programs add in does not change the result.
                tl.atomic_add(sums + pair, tl.sum(acc, axis=0) * (2 * plane + 1))

        _kernel = _move
    return _kernel
