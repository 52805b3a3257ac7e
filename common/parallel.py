"""Tensor-parallel group helpers.

The layers read the *active* group: the one a model runner activates (`use_group`) while it builds its
model and for each forward pass. No active group is a group of size 1, so a single-rank engine never
touches torch.distributed, and several engines (a TP=1 and a TP=2 one, in tests) can share a process.
The group is a plain `ProcessGroupGloo` / `ProcessGroupNCCL` (not the default world group), so the
collectives below call it directly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist

_group: dist.ProcessGroup | None = None


@contextlib.contextmanager
def use_group(group: dist.ProcessGroup | None) -> Iterator[None]:
    """Make `group` the one the layers see until the block ends (None: a single rank)."""
    global _group
    previous, _group = _group, group
    try:
        yield
    finally:
        _group = previous


def tp_rank() -> int:
    return _group.rank() if _group is not None else 0


def tp_size() -> int:
    return _group.size() if _group is not None else 1


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum `x` over the ranks, in place."""
    if _group is not None and _group.size() > 1:
        _group.allreduce([x]).wait()
    return x


def all_gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    """Concatenate each rank's shard along the last dimension (used for sharded logits)."""
    size = tp_size()
    if size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(size)]
    _group.allgather([parts], [x.contiguous()]).wait()
    return torch.cat(parts, dim=-1)


def divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator:
        raise ValueError(f"{what} ({numerator}) is not divisible by tensor_parallel_size ({denominator})")
    return numerator // denominator


# Model dimensions that are split across ranks; each must be a multiple of the group size.
SHARDED_FIELDS = ("num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size")


def check_divisible(model_config, size: int) -> None:
    """ValueError naming the first model field that `size` ranks cannot split evenly."""
    for name in SHARDED_FIELDS:
        divide(getattr(model_config, name), size, name)
