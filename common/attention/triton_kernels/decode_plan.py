"""Host-side launch planning for the paged decode attention kernel (decode_attention.py): how many
splits a launch uses and in which order its rows' programs start. Plain torch, no Triton."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

# A split should cover at least this many tokens (two 64-token tiles): below that the merge and the
# per-program setup cost more than the extra parallelism gains (H200: batch 1, 1k-4k context).
_MIN_SPLIT_TOKENS = 128
_MAX_SPLITS = 64
# Split only while there are fewer than this many (sequence, KV head) programs per SM: on the H200,
# batch 64 x 8 KV heads (3.9 per SM) already reads at full bandwidth with one split, and extra
# splits there cost 5-20% (merge traffic, shorter loops).
_PROGRAMS_PER_SM = 4
# SkewHelp's defaults: the longest rows of an unsplit launch, their most pieces, a piece's least tokens.
_HELPED_ROWS = 4
_HELP_SPLITS = 8
_HELP_MIN_SPLIT_TOKENS = 1024
_HELP_MIN_RATIO = 4


@dataclass(frozen=True)
class SkewHelp:
    """An unsplit launch (one program per sequence and KV head) lasts as long as its longest row's
    programs: a 6,000-token row among 64 rows of a few hundred tokens streams its whole context in one
    program per KV head while the others are long done (on the H100, 8B attention shape: 4x the launch
    without that row; benchmarks/engine/decode_skew.py, docs/benchmarks.md). With this help the `rows` longest
    rows (by the longest-first order) split into up to `splits` pieces of at least `min_split_tokens`,
    each piece its own program launched after the rows' own ones; shorter rows keep one split (no
    merge), and the helpers of a short row do nothing. With `min_ratio` > 0 a row is helped only when
    its context is at least `min_ratio` times the launch's median row (read on the device from the
    longest-first order): a batch of similar lengths, whose last wave nothing waits on, splits nothing.
    (On the H100 the help without that rule cost the 0.6B shape's standard workload 0.8%, with it 0.1%,
    within noise: docs/benchmarks.md "The decode help as the default".)"""

    rows: int
    splits: int
    min_split_tokens: int
    min_ratio: int = 0

    def __post_init__(self) -> None:
        if self.rows < 1 or self.splits < 2 or self.min_split_tokens < 1 or self.min_ratio < 0:
            raise ValueError(
                f"SkewHelp needs rows >= 1, splits >= 2, min_split_tokens >= 1, min_ratio >= 0: {self}"
            )


def choose_num_splits(batch: int, num_kv_heads: int, max_seq_len: int, num_sms: int) -> int:
    """Splits per sequence so the kernel fills the GPU: a power of two (few variants), from host ints only."""
    base_programs = max(1, batch * num_kv_heads)
    wanted = (num_sms * _PROGRAMS_PER_SM) // base_programs
    by_length = max(1, max_seq_len // _MIN_SPLIT_TOKENS)
    splits = max(1, min(wanted, by_length, _MAX_SPLITS))
    return 1 << (splits.bit_length() - 1)


@functools.lru_cache(maxsize=8)
def num_sms(device: torch.device) -> int:
    """Multiprocessor count of a CUDA device (cached; no sync); a small stand-in elsewhere."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def longest_first(seq_lens: torch.Tensor) -> torch.Tensor:
    """The rows ordered by descending context length: `paged_decode_attention`'s `order`. One small
    sort on the device (no host sync, capturable in a CUDA graph); padding rows (length 0) come last."""
    return torch.argsort(seq_lens, descending=True)


def wants_order(batch: int, num_kv_heads: int, num_splits: int, num_sms: int) -> bool:
    """Longest-first dispatch pays where the programs take more than one wave of SMs, i.e. a large
    unsplit batch whose lengths differ; a small batch (the latency-bound steps) skips the sort."""
    return num_splits == 1 and batch * num_kv_heads > num_sms


def skew_help(batch: int, num_kv_heads: int, num_splits: int, num_sms: int) -> SkewHelp | None:
    """The help for a launch that `wants_order` (large and unsplit); None for any other."""
    if not wants_order(batch, num_kv_heads, num_splits, num_sms):
        return None
    return SkewHelp(min(batch, _HELPED_ROWS), _HELP_SPLITS, _HELP_MIN_SPLIT_TOKENS, _HELP_MIN_RATIO)
