"""The streaming GEMV (common/layers/triton_gemv.py, 1 to MAX_ROWS rows) against `F.linear` and the eager
MLP input.

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

from common.layers.triton_gemv import MAX_ROWS, GemvLaunch, gemv, split_for  # noqa: E402

pytestmark = triton_interpret.marks()
TOL = dict(atol=1e-4, rtol=1e-4) if INTERPRET else dict(atol=3e-2, rtol=3e-2)
# Small tiles cross several column blocks and loop iterations; split 3 leaves the last part partly
# or wholly past the end of the inner dimension; block_n 16 over 50 columns leaves a ragged block.
LAUNCHES = [GemvLaunch(16, 32, split_k=1), GemvLaunch(16, 32, split_k=3), GemvLaunch(4, 64, split_k=2)]
LAUNCHES = LAUNCHES if INTERPRET else [None, *LAUNCHES]
_rand = triton_interpret.rand


# 3 rows run in a 4-row tile whose last row is masked.
ROWS = [1, 2, 3, MAX_ROWS]


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("launch", LAUNCHES)
@pytest.mark.parametrize("n,k,bias", [(48, 64, False), (50, 200, True), (64, 96, False)])
def test_projection_matches_linear(launch, n, k, bias, rows):
    torch.manual_seed(n + k)
    x, w = _rand(rows, k), _rand(n, k, scale=k**-0.5)
    b = _rand(n) if bias else None
    torch.testing.assert_close(gemv(x, w, b, launch=launch), F.linear(x, w, b), **TOL)


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("launch", LAUNCHES)
def test_silu_mul_epilogue_matches_the_mlp_input(launch, rows):
    torch.manual_seed(3)
    n, k = 40, 96
    x, w = _rand(rows, k), _rand(2 * n, k, scale=k**-0.5)
    gate, up = F.linear(x, w).chunk(2, dim=-1)
    torch.testing.assert_close(gemv(x, w, silu_mul=True, launch=launch), F.silu(gate) * up, **TOL)


@pytest.mark.parametrize("rows", [1, MAX_ROWS])
def test_repeated_split_launches_agree_exactly(rows):
    """The arrival counters are back at zero after each launch and the merge order is fixed."""
    torch.manual_seed(4)
    x, w = _rand(rows, 128), _rand(64, 128, scale=128**-0.5)
    launch = GemvLaunch(16, 32, split_k=4)
    first = gemv(x, w, launch=launch)
    assert all(torch.equal(first, gemv(x, w, launch=launch)) for _ in range(3))


def test_the_split_fills_the_device_but_keeps_whole_tiles():
    assert split_for(4096, 4096, GemvLaunch(8, 1024)) == 2  # 512 blocks -> 1,024 programs
    assert split_for(4096, 4096, GemvLaunch(4, 2048)) == 1  # 1,024 blocks fill it alone
    assert split_for(2048, 4096, GemvLaunch(4, 2048)) == 2
    assert split_for(1024, 4096, GemvLaunch(4, 2048)) == 2  # a quarter would be under one tile
    assert split_for(4096, 4096, GemvLaunch(8, 1024, split_k=3)) == 3


def test_bad_inputs_are_named():
    x, w = _rand(1, 64), _rand(32, 64)
    with pytest.raises(ValueError, match=f"1 to {MAX_ROWS} rows"):
        gemv(_rand(MAX_ROWS + 1, 64), w)
    with pytest.raises(ValueError, match=f"1 to {MAX_ROWS} rows"):
        gemv(_rand(64), w)
    with pytest.raises(ValueError, match="row-major"):
        gemv(x, _rand(32, 48))
    with pytest.raises(ValueError, match="even number"):
        gemv(x, _rand(33, 64), silu_mul=True)
    with pytest.raises(ValueError, match="no bias"):
        gemv(x, w, _rand(16), silu_mul=True)
    with pytest.raises(ValueError, match="block_n"):
        GemvLaunch(block_n=6)
    with pytest.raises(ValueError, match="split_k"):
        GemvLaunch(split_k=-1)
