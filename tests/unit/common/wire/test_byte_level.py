"""The byte table of a byte-level BPE tokenizer: built only where it decodes as the tokenizer does."""

from __future__ import annotations

import dataclasses

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from common.tools.default_model import prepare_default_model
from common.wire.byte_level import CHAR_BYTES, ByteLevelTable, token_bytes


@pytest.fixture(scope="module")
def backend() -> Tokenizer:
    return Tokenizer.from_file(str(prepare_default_model(progress=False) / "tokenizer.json"))


def test_the_character_table_is_the_byte_level_alphabet() -> None:
    assert set(CHAR_BYTES) == set(pre_tokenizers.ByteLevel.alphabet())
    assert sorted(CHAR_BYTES.values()) == list(range(256))
    assert token_bytes("Ġhi", added=False) == b" hi" and token_bytes("Ċ", added=False) == b"\n"
    assert token_bytes("<|im_end|>", added=True) == b"<|im_end|>" and token_bytes(None, added=False) == b""


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
