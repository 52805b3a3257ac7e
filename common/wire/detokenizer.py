"""Incremental detokenization with stop strings (torch-free: the router and the offline `LLM` share it).

Text is produced by decoding a small sliding window of tokens (the vLLM method): decode
tokens[prefix:read] and tokens[prefix:], and the difference is the new text; or, for a byte-level
BPE tokenizer given its `ByteLevelTable` (common/wire/byte_level.py), by feeding each token's bytes to
an incremental UTF-8 decoder, which gives the same text for a fraction of the cost. Two things are
held back:

- text ending in U+FFFD: with byte-level BPE one character (emoji, CJK) can span several tokens and
  the window decodes to a replacement character until the last byte arrives, so the client never
  sees half a character. `finish()` releases what is still held (the model really produced bad bytes).
- a tail that could be the start of a stop string: it is released once it cannot be one any more.

When a stop string appears, everything from its first character on is dropped (OpenAI semantics;
with `include_stop`, vLLM's include_stop_str_in_output, everything after its last character) and the
detokenizer reports which stop string ended the text.
"""

from __future__ import annotations

import codecs
import functools
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from common.wire.byte_level import ByteLevelTable

REPLACEMENT_CHAR = "\ufffd"
# Prompt tokens used as left context so the first generated token decodes as it would mid-text
# (tokenizers with Metaspace decoders drop the leading space of the first token otherwise).
CONTEXT_TOKENS = 5


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class DetokenizerDelta(NamedTuple):
    text: str  # new text the client may see now
    stop: str | None  # the stop string that ended the output, or None


class _WindowText:
    """New text by decoding two windows of ids through the tokenizer (any tokenizer)."""

    __slots__ = ("_decoder", "_skip_special", "_tokens", "_prefix_offset", "_read_offset")

    def __init__(self, decoder: Decoder, context: Sequence[int], skip_special: bool) -> None:
        self._decoder = decoder
        self._skip_special = skip_special
        self._tokens: list[int] = list(context[-CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._tokens)

    def new(self, token_ids: Sequence[int], final: bool) -> str:
        self._tokens.extend(token_ids)
        if self._read_offset == len(self._tokens):
            return ""
        prefix_text = self._decode(self._tokens[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._tokens[self._prefix_offset :])
        if len(full_text) <= len(prefix_text) or (full_text.endswith(REPLACEMENT_CHAR) and not final):
            return ""  # an incomplete character (or a token with no text yet): wait for more
        self._prefix_offset, self._read_offset = self._read_offset, len(self._tokens)
        return full_text[len(prefix_text) :]

    def _decode(self, ids: list[int]) -> str:
        return self._decoder.decode(ids, skip_special_tokens=self._skip_special)


class _ByteText:
    """New text from each id's bytes (byte-level BPE): the UTF-8 decoder holds an incomplete
    character's bytes until the rest arrive, and `final` turns what is left into U+FFFD."""

    __slots__ = ("_table", "_skip_special", "_utf8")

    def __init__(self, table: ByteLevelTable, skip_special: bool) -> None:
        self._table = table
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def new(self, token_ids: Sequence[int], final: bool) -> str:
        return self._utf8.decode(self._table.bytes_of(token_ids, self._skip_special), final)


class IncrementalDetokenizer:
    """Turns a stream of token ids into a stream of safe-to-show text. `byte_table`: the tokenizer's
    `ByteLevelTable` when it has one (the fast path); `decoder` is used only without it."""

    def __init__(
        self,
        decoder: Decoder,
        prompt_token_ids: Sequence[int] = (),
        stop: Sequence[str] = (),
        skip_special_tokens: bool = True,
        byte_table: ByteLevelTable | None = None,
        include_stop: bool = False,
    ) -> None:
        self._source: _WindowText | _ByteText = (
            _ByteText(byte_table, skip_special_tokens)
            if byte_table is not None
            else _WindowText(decoder, prompt_token_ids, skip_special_tokens)
        )
        self._stops = tuple(s for s in stop if s)
        self._include_stop = include_stop  # the text ends after the stop string, not before it
        self._max_stop = max((len(s) for s in self._stops), default=0)
        self._tails = _stop_tails(self._stops, self._max_stop - 1)
        # Returned text as pieces, joined only when asked for (`text`): appending to one string held in
        # an attribute copies it whole each time, quadratic in a long answer. The stop search needs
        # only the text not yet returned (`_held`) and the returned text's last characters (`_recent`:
        # a held tail may be a stop's prefix that begins in them).
        self._parts: list[str] = []
        self._held = ""
        self._recent = ""
        self.stopped: str | None = None

    @property
    def has_stop_strings(self) -> bool:
        return bool(self._stops)

    @property
    def text(self) -> str:
        """Everything returned so far."""
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""

    def add(self, token_ids: Sequence[int], check_stop: bool = True) -> DetokenizerDelta:
        """Feed newly generated tokens; returns the text that became safe to show.

        `check_stop=False` (before min_tokens is reached) lets stop strings pass, as vLLM does.
        """
        if self.stopped is not None:
            return DetokenizerDelta("", self.stopped)
        new = self._source.new(token_ids, False)
        if not self._stops:  # nothing to find or hold back: the new text goes out whole (per token)
            if new:
                self._parts.append(new)
            return DetokenizerDelta(new, None)
        before = len(self._held)
        self._held += new
        return self._release(before, final=False, check_stop=check_stop)

    def finish(self) -> DetokenizerDelta:
        """No more tokens: release held text, including an unresolved U+FFFD."""
        if self.stopped is not None:
            return DetokenizerDelta("", self.stopped)
        before = len(self._held)
        self._held += self._source.new((), True)
        return self._release(before, final=True)

    def _release(self, before: int, final: bool, check_stop: bool = True) -> DetokenizerDelta:
        """`before`: how much of `_held` was there before the new text."""
        hit = self._find_stop(before) if check_stop else None
        if hit is not None:
            position, stop = hit
            self.stopped = stop
            return self._emit(position + len(stop) if self._include_stop else position)
        if final or not check_stop:
            return self._emit(len(self._held))
        return self._emit(len(self._held) - self._stop_prefix_len())

    def _emit(self, end: int) -> DetokenizerDelta:
        """Return `_held[:end]` (nothing when `end` <= 0)."""
        if end <= 0:
            return DetokenizerDelta("", self.stopped)
        delta, self._held = self._held[:end], self._held[end:]
        self._parts.append(delta)
        keep = self._max_stop - 1
        self._recent = (self._recent + delta)[-keep:] if keep > 0 else ""
        return DetokenizerDelta(delta, self.stopped)

    def _find_stop(self, before: int) -> tuple[int, str] | None:
        """Earliest stop string that ends in the new text (it may start in older, held text); its
        position in `_held`.

        Text already returned cannot be taken back, so a stop string starting there does not count
        (that only happens when stop checking was off for min_tokens).
        """
        start = max(0, before - self._max_stop + 1)
        held = self._held
        hits = [(p, s) for s in self._stops if (p := held.find(s, start)) != -1]
        return min(hits) if hits else None

    def _stop_prefix_len(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of some stop string."""
        if not self._held:
            return 0
        text = self._recent + self._held if self._recent else self._held
        for k, prefix in self._tails.get(text[-1], ()):  # longest first; usually none end so
            if text.endswith(prefix):
                return k
        return 0


@functools.lru_cache(maxsize=32)
def _stop_tails(stops: tuple[str, ...], longest: int) -> dict[str, list[tuple[int, str]]]:
    """Every stop prefix of 1..`longest` characters, by its last character, longest first: the text's
    last character picks the few prefixes its tail can be (a scan of every length costs a slice and a
    test per length and token). Shared, read-only, by every sequence with the same stops (a request's
    n samples, repeated stop lists): its size grows with the square of a stop's length
    (`SamplingParams` bounds them)."""
    tails: dict[str, set[tuple[int, str]]] = {}
    for stop in stops:
        for k in range(1, min(len(stop), longest) + 1):
            tails.setdefault(stop[k - 1], set()).add((k, stop[:k]))
    return {ch: sorted(found, reverse=True) for ch, found in tails.items()}
