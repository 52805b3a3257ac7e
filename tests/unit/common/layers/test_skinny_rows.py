"""Which steps and weights take the skinny projection kernels or the GEMV kernel (host side only)."""

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


def test_one_row_on_large_weights_takes_the_gemv_kernel(monkeypatch) -> None:
    monkeypatch.setattr(fused, "use_fused", lambda x: True)
    row, large = torch.zeros(1, 8), fused.SKINNY_MAX_WEIGHT_BYTES + 1
    assert fused.use_gemv(row, large)
    assert not fused.use_gemv(row, fused.SKINNY_MAX_WEIGHT_BYTES)  # the skinny kernels' weights
    assert not fused.use_gemv(torch.zeros(fused.GEMV_MAX_ROWS + 1, 8), large)  # cuBLAS's tiles
    assert not fused.use_gemv(torch.zeros(8), large)
    monkeypatch.setattr(fused, "use_fused", lambda x: False)
    assert not fused.use_gemv(row, large)  # the CPU


def _gemv_rows_under(monkeypatch, **env: str) -> int:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    fused.gemv_enabled.cache_clear()
    fused.gemv_max_rows.cache_clear()
    try:
        return fused.gemv_max_rows()
    finally:
        fused.gemv_enabled.cache_clear()
        fused.gemv_max_rows.cache_clear()


def test_the_gemv_kernel_can_be_turned_off(monkeypatch) -> None:
    assert _gemv_rows_under(monkeypatch, PDSERVE_DISABLE_GEMV="1", PDSERVE_GEMV_MAX_ROWS="4") == 0


def test_the_gemv_rows_come_from_the_environment_within_the_kernel_limit(monkeypatch) -> None:
    assert _gemv_rows_under(monkeypatch) == fused.GEMV_MAX_ROWS
    assert _gemv_rows_under(monkeypatch, PDSERVE_GEMV_MAX_ROWS="3") == 3
    with pytest.raises(ValueError, match="PDSERVE_GEMV_MAX_ROWS"):
        _gemv_rows_under(monkeypatch, PDSERVE_GEMV_MAX_ROWS=str(fused.GEMV_ROWS_LIMIT + 1))


def test_a_side_stream_launch_keeps_one_row_off_the_split_kernels(monkeypatch) -> None:
    """Their arrival counters are shared per device: a chunk beside the decode step takes cuBLAS."""
    monkeypatch.setattr(fused, "use_fused", lambda x: True)
    row, large = torch.zeros(1, 8), fused.SKINNY_MAX_WEIGHT_BYTES + 1
    with fused.beside_the_engine_stream():
        with fused.beside_the_engine_stream():
            assert not fused.use_gemv(row, large)
        assert not fused.use_skinny(row, 1024)
    assert fused.use_gemv(row, large) and fused.use_skinny(row, 1024)
