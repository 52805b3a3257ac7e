"""Tensor-parallel linear layers.

Each parameter gets a `weight_loader(param, checkpoint_tensor, shard_id=None)` that copies this
rank's shard of a full checkpoint tensor into it. Column-parallel layers split the output dimension
across ranks, row-parallel layers split the input dimension and all-reduce their outputs. Merged
layers (qkv, gate_up) stack several checkpoint tensors; `shard_id` says which one is being loaded.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from common.layers.cpu_packed import packed_linear, use_packed
from common.layers.fused import gemv, skinny, use_gemv, use_skinny
from common.parallel import all_reduce, divide, tp_rank, tp_size


class LinearBase(nn.Module):
    def __init__(self, input_size: int, output_size: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        _copy_checked(param.data, loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _linear(x, self.weight, self.bias)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if use_skinny(x, weight.nbytes):
        return skinny().skinny_linear(x, weight, bias)
    if use_gemv(x, weight.nbytes):
        return gemv().gemv(x, weight, bias)
    if use_packed(x, weight):
        return packed_linear(x, weight, bias)
    return F.linear(x, weight, bias)


class ReplicatedLinear(LinearBase):
    """Every rank holds the whole weight."""


class ColumnParallelLinear(LinearBase):
    """Output dimension split across ranks; outputs stay sharded."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        self.tp_rank, self.tp_size = tp_rank(), tp_size()
        super().__init__(input_size, divide(output_size, self.tp_size, "output size"), bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        size = param.data.shape[0]
        _copy_checked(param.data, loaded.narrow(0, self.tp_rank * size, size))


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections stored as one (gate_proj + up_proj -> gate_up_proj)."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        self.output_sizes = output_sizes
        super().__init__(input_size, sum(output_sizes), bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(
                f"shard_id must be an index into {len(self.output_sizes)} parts, got {shard_id!r}"
            )
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        size = self.output_sizes[shard_id] // self.tp_size
        target = param.data.narrow(0, offset, size)
        _copy_checked(target, loaded.narrow(0, self.tp_rank * size, size))


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections in one matrix; KV heads are split across ranks like query heads."""

    def __init__(
        self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool
    ) -> None:
        size = tp_size()
        self.head_dim = head_dim
        self.num_heads = divide(num_heads, size, "num_attention_heads")
        self.num_kv_heads = divide(num_kv_heads, size, "num_key_value_heads")
        output = (num_heads + 2 * num_kv_heads) * head_dim
        super().__init__(hidden_size, output, bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        offsets = {"q": (0, q_size), "k": (q_size, kv_size), "v": (q_size + kv_size, kv_size)}
        if shard_id not in offsets:
            raise ValueError(f"shard_id must be 'q', 'k' or 'v', got {shard_id!r}")
        offset, size = offsets[shard_id]
        _copy_checked(param.data.narrow(0, offset, size), loaded.narrow(0, self.tp_rank * size, size))


class RowParallelLinear(LinearBase):
    """Input dimension split across ranks; partial outputs are summed with an all-reduce."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        self.tp_rank, self.tp_size = tp_rank(), tp_size()
        super().__init__(divide(input_size, self.tp_size, "input size"), output_size, bias)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if param.data.dim() == 1:  # the bias is added once, after the reduction
            _copy_checked(param.data, loaded)
            return
        size = param.data.shape[1]
        _copy_checked(param.data, loaded.narrow(1, self.tp_rank * size, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias if self.tp_rank == 0 else None
        return all_reduce(_linear(x, self.weight, bias))


def _copy_checked(target: torch.Tensor, loaded: torch.Tensor) -> None:
    if target.shape != loaded.shape:
        raise ValueError(f"checkpoint tensor shape {tuple(loaded.shape)} does not fit {tuple(target.shape)}")
    target.copy_(loaded)
