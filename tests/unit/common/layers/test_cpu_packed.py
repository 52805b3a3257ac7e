"""bf16 projections through oneDNN-packed weights equal `F.linear` exactly, and follow in-place
weight updates (a reloaded weight is repacked)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from common.layers.cpu_packed import _packing_usable, packed_linear, use_packed

pytestmark = pytest.mark.skipif(not _packing_usable(), reason="this CPU's oneDNN has no native bf16")


@pytest.mark.parametrize("rows", [1, 16, 300])
def test_packed_linear_equals_f_linear(rows):
    g = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 64, generator=g).bfloat16()
    bias = torch.randn(96, generator=g).bfloat16()
    x = torch.randn(rows, 64, generator=g).bfloat16()
    assert use_packed(x, weight)
    assert torch.equal(packed_linear(x, weight, bias), F.linear(x, weight, bias))
    batched = x.view(1, rows, 64)
    assert torch.equal(packed_linear(batched, weight, None), F.linear(batched, weight))


def test_repacks_after_an_in_place_weight_write():
    weight = torch.randn(32, 16).bfloat16()
    x = torch.randn(4, 16).bfloat16()
    packed_linear(x, weight, None)
    weight.copy_(torch.randn(32, 16))
    assert torch.equal(packed_linear(x, weight, None), F.linear(x, weight))


def test_float32_keeps_f_linear():
    assert not use_packed(torch.randn(2, 4), torch.randn(3, 4))
