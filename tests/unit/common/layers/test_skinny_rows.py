"""Which steps and weights take the skinny projection kernels (host side only)."""

from __future__ import annotations

import pytest
import torch

from common.layers import fused


@pytest.fixture(autouse=True)
def _fresh_flag():
    fused.skinny_max_rows.cache_clear()
    yield
    fused.skinny_max_rows.cache_clear()


def test_default_and_override(monkeypatch):
    monkeypatch.delenv("PDSERVE_SKINNY_MAX_ROWS", raising=False)
    assert fused.skinny_max_rows() == fused.SKINNY_MAX_ROWS
    fused.skinny_max_rows.cache_clear()
    monkeypatch.setenv("PDSERVE_SKINNY_MAX_ROWS", "16")
    assert fused.skinny_max_rows() == 16


@pytest.mark.parametrize("raw", ["0", "17", "four", "-1", ""])
def test_out_of_range_values_are_refused(monkeypatch, raw):
    monkeypatch.setenv("PDSERVE_SKINNY_MAX_ROWS", raw)
    with pytest.raises(ValueError, match="PDSERVE_SKINNY_MAX_ROWS"):
        fused.skinny_max_rows()


def test_large_weights_leave_the_skinny_kernels_for_cublas(monkeypatch) -> None:
    # On the CPU `use_fused` is False; pretend CUDA so that only the rows and weight-size rules decide.
    monkeypatch.setattr(fused, "use_fused", lambda x: True)
    monkeypatch.delenv("PDSERVE_SKINNY_MAX_ROWS", raising=False)
    row = torch.zeros(1, 8)
    assert fused.use_skinny(row, fused.SKINNY_MAX_WEIGHT_BYTES)
    assert not fused.use_skinny(row, fused.SKINNY_MAX_WEIGHT_BYTES + 1)
    assert not fused.use_skinny(torch.zeros(fused.SKINNY_MAX_ROWS + 1, 8), 1024)
