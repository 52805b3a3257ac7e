"""The random-weight presets have the published models' shapes (parameter counts from the model cards)."""

from __future__ import annotations

import math

import pytest

from common.tools.random_model import PRESETS, tensor_shapes, write_random_model


def _parameters(preset: str) -> int:
    return sum(math.prod(shape) for shape in tensor_shapes(PRESETS[preset]).values())


@pytest.mark.parametrize(
    ("preset", "published"),
    [
        ("qwen3-0.6b", 0.6e9),  # Qwen3-0.6B: 0.6B, tied embeddings
        ("qwen3-8b", 8.19e9),  # Qwen3-8B: 8.2B, untied
        ("llama-3-8b", 8.03e9),  # Meta-Llama-3-8B: 8.03B, untied
        ("smollm2-135m", 134.5e6),  # SmolLM2-135M: 135M, tied
    ],
)
def test_presets_have_the_published_parameter_count(preset, published):
    assert _parameters(preset) == pytest.approx(published, rel=0.01)


def test_untied_presets_write_an_lm_head():
    assert "lm_head.weight" in tensor_shapes(PRESETS["qwen3-8b"])
    assert "lm_head.weight" not in tensor_shapes(PRESETS["qwen3-0.6b"])


def test_unknown_preset_is_refused(tmp_path):
    with pytest.raises(ValueError, match="preset"):
        write_random_model(tmp_path, "qwen3-9000b")
