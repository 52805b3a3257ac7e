"""blocks_for: the one ceil-division of block counts."""

from __future__ import annotations

import math

import pytest

from common.wire.blocks import blocks_for


@pytest.mark.parametrize("block_size", [1, 3, 16, 256])
def test_matches_ceil_division(block_size: int) -> None:
    for n in range(0, 4 * block_size + 2):
        assert blocks_for(n, block_size) == math.ceil(n / block_size)


@pytest.mark.parametrize(
    ("num_tokens", "block_size", "field"), [(4, 0, "block_size"), (-1, 16, "num_tokens")]
)
def test_rejects_bad_sizes(num_tokens: int, block_size: int, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        blocks_for(num_tokens, block_size)
