"""SiLU(gate) * up over a merged [gate | up] projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from common.layers.fused import ops, use_fused


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if use_fused(x):
            return ops().silu_and_mul(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
