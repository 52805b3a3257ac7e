"""The random-weight presets have the published models' shapes (parameter counts from the model cards)."""

from __future__ import annotations

import math

import pytest

from common.tools.random_model import (
    PRESETS,
    cover_vocabulary,
    tensor_shapes,
    uncovered_ids,
    write_random_model,
)


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


def _word_level(path, size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(size)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()  # joins words with spaces
    tok.save(str(path))


def test_a_borrowed_tokenizer_decodes_every_id_of_the_model_to_text(tmp_path):
    from tokenizers import Tokenizer

    path = tmp_path / "tokenizer.json"
    _word_level(path, 10)
    (tmp_path / "config.json").write_text('{"vocab_size": 25}')
    assert Tokenizer.from_file(str(path)).decode([12]) == ""  # an id it lacks: no text at all
    assert uncovered_ids(tmp_path) == 15
    assert cover_vocabulary(path, 25) == 15
    assert uncovered_ids(tmp_path) == 0
    tok = Tokenizer.from_file(str(path))
    assert tok.get_vocab_size(with_added_tokens=True) == 25
    assert all(tok.decode([i]) for i in range(25))
    assert tok.decode([12]) == "<id:12>" and tok.decode([3]) == "w3"  # its own ids unchanged
    assert tok.encode("w3 w4").ids == [3, 4]
    assert cover_vocabulary(path, 25) == 0 and cover_vocabulary(path, 5) == 0  # covered: left alone
