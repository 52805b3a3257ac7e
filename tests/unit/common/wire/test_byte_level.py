"""The byte table of a byte-level BPE tokenizer: built only where it decodes as the tokenizer does."""

from __future__ import annotations

import dataclasses

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from common.tools.default_model import prepare_default_model
from common.wire.byte_level import CHAR_BYTES, ByteLevelTable, token_bytes


@pytest.fixture(scope="module")
def backend() -> Tokenizer:
    return Tokenizer.from_file(str(prepare_default_model(progress=False) / "tokenizer.json"))


def test_the_character_table_is_the_byte_level_alphabet() -> None:
    assert set(CHAR_BYTES) == set(pre_tokenizers.ByteLevel.alphabet())
    assert sorted(CHAR_BYTES.values()) == list(range(256))
    assert token_bytes("Ġhi") == b" hi" and token_bytes("Ċ") == b"\n"
    assert token_bytes("<|im_end|>") == b"<|im_end|>" and token_bytes(None) == b""
    assert token_bytes("a b") == b"a b"  # a space is no byte-level character: the entry's own UTF-8


def test_a_table_is_kept_only_while_it_agrees_with_the_tokenizer(backend: Tokenizer) -> None:
    table = ByteLevelTable.from_tokenizer(backend)
    assert table is not None and table.agrees_with(backend)
    space = backend.token_to_id("Ġ")
    wrong = list(table.with_special)
    wrong[space] = b"_"
    tampered = dataclasses.replace(table, with_special=tuple(wrong), without_special=tuple(wrong))
    assert not tampered.agrees_with(backend)


def test_other_decoders_get_no_table() -> None:
    tok = Tokenizer(models.WordLevel({"a": 0, "b": 1}, unk_token="a"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece()
    assert ByteLevelTable.from_tokenizer(tok) is None


def test_added_tokens_decode_as_the_byte_level_decoder_takes_them() -> None:
    """The decoder maps an added token's characters to bytes like any token's ("ĠX" is " X"), unless
    one is no byte-level character ("a b" stays "a b"); specials are skipped on request."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE({ch: i for i, ch in enumerate(alphabet)}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens([AddedToken("ĠX", normalized=False), AddedToken("a b", normalized=False)])
    tok.add_special_tokens([AddedToken("<s>", special=True)])
    table = ByteLevelTable.from_tokenizer(tok)
    assert table is not None
    ids = [tok.token_to_id(t) for t in ("h", "ĠX", "a b", "<s>")]
    for skip in (True, False):
        assert table.bytes_of(ids, skip).decode() == tok.decode(ids, skip_special_tokens=skip)
    assert table.bytes_of(ids, False) == b"h Xa b<s>"
