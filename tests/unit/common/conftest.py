"""Fixtures the engine's GPU tests share."""

from __future__ import annotations

import pytest

from tests.helpers.gpu_llm import qwen3_fp32_dir


@pytest.fixture(scope="module")
def qwen3_fp32(tmp_path_factory) -> str:
    """Qwen3-0.6B-architecture float32 weights with seed 0 (written once per module that asks)."""
    return qwen3_fp32_dir(tmp_path_factory)
