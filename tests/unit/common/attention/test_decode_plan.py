"""decode_plan's rules that need no kernel: when a decode launch gets the skew help, and its checks."""

from __future__ import annotations

import pytest

from common.attention.triton_kernels.decode_plan import SkewHelp, skew_help


def test_only_large_unsplit_launches_get_help():
    # 512 programs: one per row and KV head; rows of 4x the median at least
    assert skew_help(64, 8, 1, 132) == SkewHelp(4, 8, 1024, 4)
    assert skew_help(256, 8, 1, 132).rows == 4
    assert skew_help(64, 8, 2, 132) is None  # split launches already cut every row
    assert skew_help(16, 8, 1, 132) is None  # one wave of programs: nothing waits on a long row


@pytest.mark.parametrize(
    "rows,splits,tokens,ratio", [(0, 8, 1024, 0), (4, 1, 1024, 0), (4, 8, 0, 0), (4, 8, 1, -1)]
)
def test_a_help_that_cannot_split_is_refused(rows, splits, tokens, ratio):
    with pytest.raises(ValueError, match="SkewHelp"):
        SkewHelp(rows, splits, tokens, ratio)
