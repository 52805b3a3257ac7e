"""How many rows a step may have for its projections to take the skinny kernels (host side only)."""

from __future__ import annotations

import pytest

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
