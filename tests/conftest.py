"""Shared fixtures: tiny random checkpoints (written once per session) and GPU skipping."""

from __future__ import annotations

import pytest
import torch

from common.tools.tiny_models import write_tiny_model


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tiny_models")
    return {arch: str(write_tiny_model(arch, root / arch)) for arch in ("llama", "qwen2", "qwen3")}
