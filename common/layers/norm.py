"""RMSNorm with an optional fused residual add (the residual stream is carried in fp32-free form)."""

from __future__ import annotations

import torch
from torch import nn

from common.layers.fused import ops, use_fused


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x.to(dtype) * self.weight

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Without `residual`: norm(x). With it: (norm(x + residual), x + residual)."""
        if use_fused(x) and x.dim() == 2:
            return ops().rmsnorm(x, self.weight, self.eps, residual)
        if residual is None:
            return self._norm(x)
        summed = (x.float() + residual.float()).to(x.dtype)
        return self._norm(summed), summed
