"""benchmarks/engine/decode_skew.py times its three arms on a small skewed batch (a CUDA GPU)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_both_arms_are_timed_for_each_batch_and_count_of_long_rows(capsys):
    from benchmarks.engine import decode_skew

    argv = ["--batches", "64", "--short", "64", "--short-max", "256", "--long", "2048", "--long-rows", "0,1"]
    rows = decode_skew.main(argv)
    assert [(r[0], r[1]) for r in rows] == [(64, 0), (64, 1)]
    assert all(r[2] > 0 and r[3] > 0 and r[4] > 0 for r in rows)
    assert "saved ms/step" in capsys.readouterr().out
