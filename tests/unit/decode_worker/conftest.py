"""Fixtures shared by the decode worker's tests."""

from __future__ import annotations

import pytest

from tests.unit.decode_worker.cases import offline_reference


@pytest.fixture(scope="module")
def reference(tiny_model_dirs) -> list[list[int]]:
    """The offline engine's greedy outputs for `cases.PROMPTS` on the tiny llama model."""
    return offline_reference(tiny_model_dirs["llama"])
