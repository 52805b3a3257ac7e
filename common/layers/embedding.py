"""Vocabulary-parallel embedding and LM head (vocabulary rows split across ranks)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from common.layers.cpu_packed import packed_linear, use_packed
from common.layers.fused import gemv, use_lm_head_gemv
from common.parallel import all_gather_last_dim, all_reduce, divide, tp_rank, tp_size


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = tp_rank(), tp_size()
        self.vocab_size = vocab_size
        self.shard_size = divide(vocab_size, self.tp_size, "vocab_size")
        self.start = self.shard_size * self.tp_rank
        self.weight = nn.Parameter(torch.empty(self.shard_size, hidden_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        shard = loaded.narrow(0, self.start, self.shard_size)
        if shard.shape != param.data.shape:
            raise ValueError(f"embedding shape {tuple(loaded.shape)} does not fit {tuple(param.data.shape)}")
        param.data.copy_(shard)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        inside = (local >= 0) & (local < self.shard_size)
        out = F.embedding(local.clamp(0, self.shard_size - 1), self.weight) * inside.unsqueeze(-1)
        return all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Projects hidden states (already reduced to the positions that sample) to full-vocab logits."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if use_packed(hidden, self.weight):
            return all_gather_last_dim(packed_linear(hidden, self.weight, None))
        if use_lm_head_gemv(hidden, self.weight.nbytes):
            return all_gather_last_dim(gemv().gemv(hidden, self.weight))
        return all_gather_last_dim(F.linear(hidden, self.weight))
