"""Skinny projection kernels (common/layers/triton_skinny.py) against the eager layers they replace.

Runs on a CUDA machine (marked `gpu`, bf16) and on the CPU under the Triton interpreter when
`PDSERVE_TRITON_INTERPRET=1` (fp32). Anywhere else the module skips.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import triton_interpret

triton_interpret.setup_or_skip()
INTERPRET = triton_interpret.ENABLED

from common.layers.triton_skinny import SkinnyLaunch, skinny_linear  # noqa: E402

pytestmark = triton_interpret.marks()
TOL = dict(atol=1e-4, rtol=1e-4) if INTERPRET else dict(atol=3e-2, rtol=3e-2)
# Small tiles keep the interpreter quick and make the shapes below cross several tiles and loops.
# split_k 3 leaves the last part partly or wholly past the end of the inner dimension.
SMALL = [SkinnyLaunch(16, 32, 4, 2, split_k=1), SkinnyLaunch(16, 32, 4, 2, split_k=3)]
LAUNCHES = SMALL if INTERPRET else [None, *SMALL]
_rand = triton_interpret.rand


def _rmsnorm(x, weight, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


@pytest.mark.parametrize("launch", LAUNCHES)
@pytest.mark.parametrize("rows,n,k,bias", [(1, 48, 64, False), (3, 50, 70, True), (16, 64, 96, False)])
def test_plain_projection_matches_linear(launch, rows, n, k, bias):
    torch.manual_seed(rows * n + k)
    x, w = _rand(rows, k), _rand(n, k, scale=k**-0.5)
    b = _rand(n) if bias else None
    torch.testing.assert_close(skinny_linear(x, w, b, launch=launch), F.linear(x, w, b), **TOL)


@pytest.mark.parametrize("launch", LAUNCHES)
@pytest.mark.parametrize("rows,with_residual", [(1, True), (5, False), (16, True)])
def test_norm_prologue_and_next_residual(launch, rows, with_residual):
    torch.manual_seed(rows)
    n, k, eps = 40, 72, 1e-6
    x, w, g = _rand(rows, k), _rand(n, k, scale=k**-0.5), 1 + 0.1 * _rand(k)
    res = _rand(rows, k) if with_residual else None
    got = skinny_linear(x, w, residual=res, norm_weight=g, eps=eps, launch=launch)
    summed = x if res is None else (x.float() + res.float()).to(x.dtype)
    want = F.linear(_rmsnorm(summed, g, eps), w)
    if res is None:
        torch.testing.assert_close(got, want, **TOL)
    else:
        out, new_res = got
        torch.testing.assert_close(out, want, **TOL)
        torch.testing.assert_close(new_res, summed, atol=0, rtol=0)


@pytest.mark.parametrize("launch", LAUNCHES)
@pytest.mark.parametrize("rows", [1, 8])
def test_silu_mul_epilogue_matches_the_mlp_input(launch, rows):
    torch.manual_seed(rows)
    inter, k, eps = 36, 48, 1e-6
    x, res, g = _rand(rows, k), _rand(rows, k), 1 + 0.1 * _rand(k)
    w = _rand(2 * inter, k, scale=k**-0.5)
    out, new_res = skinny_linear(x, w, residual=res, norm_weight=g, eps=eps, silu_mul=True, launch=launch)
    gate, up = F.linear(_rmsnorm(new_res, g, eps), w).chunk(2, dim=-1)
    torch.testing.assert_close(out, F.silu(gate) * up, **TOL)


def test_bad_inputs_are_named():
    x, w = _rand(17, 8), _rand(16, 8)
    with pytest.raises(ValueError, match="at most 16 rows"):
        skinny_linear(x, w)
    with pytest.raises(ValueError, match="residual"):
        skinny_linear(x[:2], w, residual=x[:2])
    with pytest.raises(ValueError, match="bias"):
        skinny_linear(x[:2], w, _rand(8), silu_mul=True)
