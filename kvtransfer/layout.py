"""Cache layout checks and the block gather/scatter every transport shares.

A block b is `kv_cache[:, :, b]` (all layers, k and v; with an fp8 cache also the block's scales, which
live in extra rows of the block, common/attention/kv_fp8.py, so they move wherever the block moves).
Gathers and scatters go through the flat view `[2 * num_layers, num_blocks, block_elems]`: the same
bytes, but torch's index kernels are an order of magnitude faster on it than on the 6-d tensor
(measured on CPU), and one call moves many blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from common.wire.kv_messages import BlockLayout

_DTYPES = {
    str(dt).removeprefix("torch."): dt
    for dt in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.uint8, torch.int8)
}
_DTYPES.update({"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2})


@dataclass(frozen=True)
class CacheLayout:
    """Everything two caches must agree on for their blocks to be byte-compatible."""

    dtype: str
    num_layers: int
    block_size: int
    num_kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, kv_cache: torch.Tensor) -> CacheLayout:
        _, layers, _, block_size, heads, head_dim = kv_cache.shape
        return cls(str(kv_cache.dtype).removeprefix("torch."), layers, block_size, heads, head_dim)

    def to_wire(self) -> BlockLayout:
        shape = [self.num_layers, self.block_size, self.num_kv_heads, self.head_dim]
        return BlockLayout(self.dtype, shape)

    @classmethod
    def from_wire(cls, value: BlockLayout) -> CacheLayout:
        """A peer's layout (the codec checked its form); ValueError for a dtype this side cannot hold."""
        if value.dtype not in _DTYPES:
            raise ValueError(f"layout.dtype {value.dtype!r} is not a supported dtype")
        return cls(value.dtype, *value.shape)

    def mismatch(self, other: CacheLayout) -> str | None:
        """Why blocks of `other` cannot be copied into blocks of `self`, or None."""
        if self.dtype != other.dtype:
            return (
                f"dtype mismatch: sender {other.dtype}, receiver {self.dtype} (a prefill and a decode worker "
                "pair only with the same --dtype and --kv-cache-dtype)"
            )
        if self != other:
            return (
                "block shape mismatch [num_layers, block_size, num_kv_heads, head_dim]: "
                f"sender {other.to_wire().shape}, receiver {self.to_wire().shape}"
            )
        return None

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def block_elems(self) -> int:
        """Elements of one block within one (k or v, layer) plane."""
        return self.block_size * self.num_kv_heads * self.head_dim

    @property
    def block_bytes(self) -> int:
        """Bytes of one whole block (k and v, all layers)."""
        return 2 * self.num_layers * self.block_elems * self.torch_dtype.itemsize


def dtype_from_name(name: object) -> torch.dtype:
    """The torch dtype named like `str(dtype)` without "torch."; ValueError for anything else."""
    if not isinstance(name, str) or name not in _DTYPES:
        raise ValueError(f"unsupported dtype {name!r}")
    return _DTYPES[name]


def flat_view(kv_cache: torch.Tensor) -> torch.Tensor:
    """[2 * num_layers, num_blocks, block_elems] view of a contiguous cache (no copy)."""
    two, layers, num_blocks = kv_cache.shape[:3]
    return kv_cache.view(two * layers, num_blocks, -1)


def gather(kv_cache: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Blocks `index` (a long tensor on the cache's device) as one contiguous [2L, n, block_elems] tensor."""
    flat = flat_view(kv_cache)
    return _words(flat).index_select(1, index).view(flat.dtype)


def scatter(kv_cache: torch.Tensor, index: torch.Tensor, blocks: torch.Tensor) -> None:
    """Write `blocks` ([2L, n, block_elems], the cache's device and dtype) into blocks `index`."""
    _words(flat_view(kv_cache)).index_copy_(1, index, _words(blocks.contiguous()))


def _words(blocks: torch.Tensor) -> torch.Tensor:
    """The same bytes with 64-bit elements along the last dimension where a block's row of it is a whole
    number of words (torch's CPU index kernels move 8-byte elements 1.7x faster than 2-byte ones on the
    CPU box); the tensor itself otherwise."""
    if blocks.shape[-1] * blocks.element_size() % 8 or blocks.element_size() >= 8:
        return blocks
    return blocks.view(torch.uint8).view(torch.int64)
