"""A poisoned paged KV cache for attention kernel tests (tests/unit/common/attention)."""

from __future__ import annotations

import math
import zlib

import torch

from common.attention.base import AttentionMetadata


class PagedContext:
    """A poisoned paged KV cache holding `seq_lens` tokens per sequence in shuffled blocks."""

    def __init__(self, seq_lens, block_size, num_kv_heads, head_dim, dtype, gen, device, spare_blocks=2):
        self.device = device
        blocks_per_seq = [math.ceil(s / block_size) for s in seq_lens]
        num_blocks = sum(blocks_per_seq) + spare_blocks + 1
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.k_cache = torch.randn(shape, generator=gen).to(self.device, dtype)
        self.v_cache = torch.randn(shape, generator=gen).to(self.device, dtype)
        ids = torch.randperm(num_blocks, generator=gen)
        poison_block = int(ids[-1])
        width = max(blocks_per_seq) + 1
        self.block_tables = torch.full((len(seq_lens), width), poison_block, dtype=torch.int32)
        used = 0
        for i, n in enumerate(blocks_per_seq):
            self.block_tables[i, :n] = ids[used : used + n]
            used += n
        self.block_size = block_size
        self.seq_lens = list(seq_lens)
        self._poison(poison_block)
        self.block_tables = self.block_tables.to(self.device)

    def _poison(self, poison_block: int) -> None:
        for cache in (self.k_cache, self.v_cache):
            cache[poison_block] = float("nan")
            for i, seq_len in enumerate(self.seq_lens):
                if seq_len % self.block_size:
                    last = int(self.block_tables[i, seq_len // self.block_size])
                    cache[last, seq_len % self.block_size :] = float("nan")

    def clean_caches(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The caches with the poison zeroed, for the reference: correct attention never reads those
        slots, but a reference that gathers whole blocks and masks afterwards would turn NaN * 0 into NaN."""
        return self.k_cache.nan_to_num(0.0), self.v_cache.nan_to_num(0.0)

    def meta(self, q_lens, is_decode: bool, seq_lens=None) -> AttentionMetadata:
        """Metadata for a step with `q_lens` new tokens per sequence (contexts default to `self.seq_lens`)."""
        seq_lens = list(seq_lens or self.seq_lens)
        starts = [0]
        for q_len in q_lens:
            starts.append(starts[-1] + q_len)
        return AttentionMetadata(
            is_decode=is_decode,
            slot_mapping=self._slots(q_lens, seq_lens),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=self.device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=self.device),
            block_tables=self.block_tables,
            max_query_len=max(q_lens),
            max_seq_len=max(seq_lens),
            query_start_loc_host=starts,
            seq_lens_host=seq_lens,
        )

    def _slots(self, q_lens, seq_lens) -> torch.Tensor:
        """Flat slots of each sequence's last q_len positions (this step's new tokens)."""
        table = self.block_tables.cpu()
        out = []
        for i, (q_len, seq_len) in enumerate(zip(q_lens, seq_lens, strict=True)):
            for pos in range(seq_len - q_len, seq_len):
                out.append(int(table[i, pos // self.block_size]) * self.block_size + pos % self.block_size)
        return torch.tensor(out, dtype=torch.int64, device=self.device)


def generator(*key) -> torch.Generator:
    """A CPU generator seeded from `key`: every test case draws its own reproducible numbers."""
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))
