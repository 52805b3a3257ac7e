"""Byte-level BPE text by table lookup: each token id stands for a fixed byte string.

With a byte-level BPE tokenizer (GPT-2's scheme: SmolLM2, Qwen, Llama 3) a token's text is a run of
printable characters, each standing for one byte, and decoding a sequence is the UTF-8 of the
concatenated bytes (the decoder takes an entry made of other characters, such as an added token with a
space in it, as its own UTF-8; added tokens go through the same rule). So once each
id's bytes are known, a stream decodes with an incremental UTF-8 decoder instead of decoding windows
of ids through the tokenizer twice per token (common/wire/detokenizer.py): half the detokenizer's
time per token on the CPU box (benchmarks/serving/detokenize.py; docs/benchmarks.md).

Invariant: for any ids, `bytes_of(ids, skip).decode("utf-8", "replace")` equals the tokenizer's own
`decode(ids, skip_special_tokens=skip)`. `from_tokenizer` builds a table only for a tokenizer whose
decoder is the plain `ByteLevel` one, and keeps it only if it agrees with the tokenizer on a fixed
sample of sequences; otherwise None, and callers decode through the tokenizer.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def _char_bytes() -> dict[str, int]:
    """GPT-2's byte -> printable character table, inverted: printable Latin-1 bytes stand for
    themselves, the other 68 for the characters from U+0100 on, in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[chr(byte)] = byte
        else:
            table[chr(0x100 + extra)] = byte
            extra += 1
    return table


CHAR_BYTES = _char_bytes()
# Sequences compared with the tokenizer's own decode before a table is used.
_CHECK_SEQUENCES = 400


def token_bytes(token: str | None) -> bytes:
    """The bytes one vocabulary or added-token entry stands for, as the ByteLevel decoder takes it: each
    character's byte when all are byte-level characters, else the entry's own UTF-8 (an id without an
    entry decodes to nothing)."""
    if token is None:
        return b""
    try:
        return bytes([CHAR_BYTES[ch] for ch in token])
    except KeyError:  # not byte-level characters: the decoder passes the token's own UTF-8 through
        return token.encode()


@dataclass(frozen=True)
class ByteLevelTable:
    """`with_special[i]`: id i's bytes; `without_special`: the same with special tokens as b''."""

    with_special: tuple[bytes, ...]
    without_special: tuple[bytes, ...]

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> ByteLevelTable | None:
        """The table of a `tokenizers.Tokenizer` with a plain ByteLevel decoder that agrees with it;
        else None."""
        from tokenizers import decoders

        if not isinstance(tokenizer.decoder, decoders.ByteLevel):
            return None
        added = tokenizer.get_added_tokens_decoder()
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        table = tuple(token_bytes(tokenizer.id_to_token(i)) for i in range(size))
        special = {i for i, token in added.items() if token.special}
        plain = tuple(b"" if i in special else b for i, b in enumerate(table))
        built = cls(table, plain)
        return built if built.agrees_with(tokenizer) else None

    def bytes_of(self, ids: Sequence[int], skip_special: bool) -> bytes:
        table = self.without_special if skip_special else self.with_special
        try:
            return b"".join([table[i] for i in ids])
        except IndexError:  # an id past the tokenizer's vocabulary decodes to nothing, as there
            return b"".join([table[i] if 0 <= i < len(table) else b"" for i in ids])

    def agrees_with(self, tokenizer: Any) -> bool:
        """Whether the table decodes a fixed sample of random sequences (every added token among them,
        and ids past the vocabulary) exactly as `tokenizer.decode` does."""
        rng = random.Random(0)
        size = len(self.with_special)
        added = sorted(tokenizer.get_added_tokens_decoder())
        for n in range(max(_CHECK_SEQUENCES, len(added))):
            ids = [rng.randrange(size + 8) for _ in range(1 + n % 24)] + added[n : n + 1]
            rng.shuffle(ids)
            for skip in (True, False):
                mine = self.bytes_of(ids, skip).decode("utf-8", "replace")
                if mine != tokenizer.decode(ids, skip_special_tokens=skip):
                    return False
        return True
