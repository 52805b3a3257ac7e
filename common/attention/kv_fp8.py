"""The fp8 KV cache (`kv_cache_dtype="fp8"`): its dtype, its scales and where they live.

Values are float8_e4m3fn. Each (token, KV head) key or value vector has its own float32 scale,
amax(|x|) / 448 (448 is e4m3's largest finite value), computed when the vector is stored: dynamic, so
no calibration, and a vector never shares a scale with a later one. A per-block scale fixed at a block's
first write would clip every later token of that block that is larger; a per-block scale recomputed on
each write would re-quantise (and so degrade) the tokens already there. One float per head_dim values
is 4 / head_dim of the values' bytes, rounded up to whole rows per block: at 16-token blocks one row
of 16, 6% of an fp8 block (a block then takes 17/32 of a bf16 block's bytes at any head_dim >= 64).

Where the scales live: inside the cache tensor, in `scale_rows` extra token rows at the end of every
block. The engine's cache is `[2, num_layers, num_blocks, block_size + scale_rows, num_kv_heads,
head_dim]` (fp8); the first `block_size` rows of a block are its tokens, the rest hold the block's
`block_size x num_kv_heads` float32 scales, token-major. So a block's scales are part of the block's
bytes: the KV hand-off (kvtransfer, every transport), its checksums, the prefix cache and CUDA graphs
(one fixed-address tensor) carry them with no code of their own. Attention layers get views of the first
`block_size` rows (`layer_views`): `[num_blocks, block_size, num_kv_heads, head_dim]` with a block stride
that skips the scale rows, which every kernel already reads through strides; `scales_of(view)` is the
`[num_blocks, block_size, num_kv_heads]` float32 view of the same block's scales. This module is the one
place that knows that layout; the bf16/fp32 cache (`"auto"`) is laid out exactly as before.

Readers dequantise in registers: the Triton kernels multiply the q.k scores by the key scale and the
softmax weights by the value scale (scale is per token, so (q . k8) * sk == q . (k8 * sk)); the torch
backend dequantises the gathered context.
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
# Smallest scale: an all-zero vector stores zeros with this scale instead of dividing by zero. Any
# positive value works (|x| <= amax means |x| / max(amax / 448, eps) <= 448).
SCALE_EPS = 1e-12
_SCALE_BYTES = 4  # float32


def kv_cache_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The torch dtype of the KV cache for EngineConfig.kv_cache_dtype (validated there)."""
    if kv_cache_dtype == "auto":
        return model_dtype
    if kv_cache_dtype == "fp8":
        return FP8_DTYPE
    raise ValueError(f"kv_cache_dtype must be 'auto' or 'fp8', got {kv_cache_dtype!r}")


def is_fp8(cache: torch.Tensor) -> bool:
    return cache.dtype == FP8_DTYPE


def scale_rows(block_size: int, head_dim: int) -> int:
    """Token rows appended to each block to hold its block_size x num_kv_heads float32 scales (a row is
    num_kv_heads x head_dim bytes, so num_kv_heads cancels)."""
    if head_dim % _SCALE_BYTES:
        raise ValueError(f"kv_cache_dtype fp8 needs head_dim divisible by {_SCALE_BYTES}, got {head_dim}")
    return -(-block_size * _SCALE_BYTES // head_dim)


def cache_shape(
    num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> tuple[int, ...]:
    """The engine's cache tensor shape for `dtype` (fp8 blocks carry their scale rows)."""
    rows = block_size + (scale_rows(block_size, head_dim) if dtype == FP8_DTYPE else 0)
    return (2, num_layers, num_blocks, rows, num_kv_heads, head_dim)


def layer_views(kv_cache: torch.Tensor, block_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (k, v) views `[num_blocks, block_size, num_kv_heads, head_dim]` of the engine cache."""
    return [
        (kv_cache[0, i, :, :block_size], kv_cache[1, i, :, :block_size]) for i in range(kv_cache.shape[1])
    ]


def scales_of(view: torch.Tensor) -> torch.Tensor:
    """The float32 scales `[num_blocks, block_size, num_kv_heads]` of an fp8 layer view (a view of the
    same storage: writes land in the cache). The scales start right after the block's token rows."""
    num_blocks, block_size, heads, head_dim = view.shape
    if not is_fp8(view) or view.stride(2) != head_dim or view.stride(1) != heads * head_dim:
        raise ValueError("scales_of needs a layer view of an fp8 cache (kv_fp8.layer_views)")
    words = view.view(torch.float32)  # the same bytes as 4-byte words (strides and offset / 4)
    token_bytes = block_size * heads * head_dim
    return words.as_strided(
        (num_blocks, block_size, heads),
        (words.stride(0), heads, 1),
        words.storage_offset() + token_bytes // _SCALE_BYTES,
    )


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., head_dim] -> (fp8 values [..., head_dim], float32 scales [...]); x ~= values * scales."""
    xf = x.float()
    scale = (xf.abs().amax(-1) / FP8_MAX).clamp(min=SCALE_EPS)
    values = (xf / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return values, scale


def dequantize(values: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """values [..., head_dim] (fp8) times scales [...] (float32), in `dtype`."""
    return (values.float() * scales.unsqueeze(-1)).to(dtype)


def store(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor
) -> None:
    """Quantise k, v [n, num_kv_heads, head_dim] into fp8 layer views at flat `slots` (all >= 0)."""
    block_size = k_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    for x, cache in ((k, k_cache), (v, v_cache)):
        values, scales = quantize(x)
        cache[blocks, offsets] = values
        scales_of(cache)[blocks, offsets] = scales


def gather(cache: torch.Tensor, blocks: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Blocks `blocks` (1-d long) of an fp8 layer view, dequantised: [n, block_size, heads, head_dim]."""
    return dequantize(cache.index_select(0, blocks), scales_of(cache).index_select(0, blocks), dtype)
