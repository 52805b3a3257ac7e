"""Fixtures shared by the integration tests: the default model, its router-side tokenizer, and an
offline engine on the same model (the reference the cluster's greedy outputs must equal)."""

from __future__ import annotations

import pytest

from common.tools.default_model import prepare_default_model


@pytest.fixture(scope="session")
def model_dir() -> str:
    return str(prepare_default_model(progress=False))


@pytest.fixture(scope="session")
def tokenizer(model_dir: str):
    from router.tokenizer import ModelTokenizer

    return ModelTokenizer.from_dir(model_dir)


@pytest.fixture(scope="session")
def offline(model_dir: str):
    from common import LLM

    return LLM(model_dir, num_kvcache_blocks=256, enforce_eager=True)
