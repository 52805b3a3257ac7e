"""The random-weight presets have the published models' shapes (parameter counts from the model cards)."""

from __future__ import annotations

import math

import pytest

from common.tools.random_model import (
    PRESETS,
    cover_vocabulary,
    partial_text_ids,
    silence_ids,
    tensor_shapes,
    uncovered_ids,
    write_random_model,
)
from common.wire.byte_level import CHAR_BYTES


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


def _byte_level(path) -> None:
    """A byte-level BPE tokenizer of the 256 byte tokens alone, in byte order."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    by_byte = sorted(alphabet, key=lambda ch: CHAR_BYTES[ch])
    tok = Tokenizer(models.BPE({ch: i for i, ch in enumerate(by_byte)}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(path))


def test_byte_tokens_of_multibyte_characters_are_never_chosen_greedily(tmp_path):
    import torch

    path = tmp_path / "tokenizer.json"
    _byte_level(path)
    ids = partial_text_ids(path)
    assert ids == list(range(0x80, 0x100))  # alone, a byte >= 0x80 is no complete UTF-8 text
    cfg = {"tie_word_embeddings": False}
    gen = torch.Generator().manual_seed(0)
    tensors = {
        "lm_head.weight": torch.randn(256, 64, generator=gen),
        "model.embed_tokens.weight": torch.ones(256, 64),
    }
    silence_ids(tensors, cfg, ids)
    head = tensors["lm_head.weight"]
    assert head[ids].abs().sum() == 0 and head[:0x80].abs().min() > 0
    assert tensors["model.embed_tokens.weight"].min() == 1  # untied: the input embeddings keep them
    hidden = torch.randn(500, 64, generator=gen)
    assert (hidden @ head.T).argmax(dim=1).max() < 0x80  # greedy picks only the complete-text ids
    tied = {"model.embed_tokens.weight": torch.ones(256, 64)}
    silence_ids(tied, {"tie_word_embeddings": True}, ids)
    assert tied["model.embed_tokens.weight"][ids].sum() == 0
