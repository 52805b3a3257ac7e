"""The SM-split probe's decode step and prefill pass (benchmarks/engine/share_probe.py) on the CPU: one
pass of the rows through every projection of the shape, in the shape's order, so the probe reads what a
decode step reads. Its timing arms need CUDA and green contexts (run on the device)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.engine import share_probe


@pytest.fixture
def tiny_shape(monkeypatch):
    # hidden, intermediate, q heads x head_dim, kv heads x head_dim, layers
    monkeypatch.setitem(share_probe.SHAPES, "tiny", (32, 48, 64, 16, 2))
    return "tiny"


def test_weights_follow_the_shape(tiny_shape):
    weights = share_probe.make_weights(tiny_shape, torch.device("cpu"))
    assert len(weights) == 2
    qkv, o, gate_up, down = weights[0]
    assert qkv.shape == (32, 64 + 2 * 16) and o.shape == (64, 32)
    assert gate_up.shape == (32, 2 * 48) and down.shape == (48, 32)
    assert all(w.dtype == torch.bfloat16 for layer in weights for w in layer)


def test_a_pass_multiplies_the_rows_through_every_projection(tiny_shape):
    weights = share_probe.make_weights(tiny_shape, torch.device("cpu"))
    x = torch.randn(3, 32).to(torch.bfloat16)
    want = x
    for qkv, o, gate_up, down in weights:
        want = (((want @ qkv)[:, :64] @ o) @ gate_up)[:, :48] @ down
    got = share_probe.forward(x, weights)
    assert got.shape == (3, 32)
    torch.testing.assert_close(got, want)
