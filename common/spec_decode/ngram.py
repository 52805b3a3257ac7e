"""N-gram prompt lookup, the n-gram proposer's search: the last n generated-or-prompt tokens (n from
`max_n` down to `min_n`) are looked up in the sequence's earlier tokens, and what followed the most
recent match is proposed, k tokens. A match p tokens back says the text repeats with period p, so
where the known tokens run out the proposal goes on around the period (`periodic`): a loop of one
token proposes k copies of it."""

from __future__ import annotations


def ngram_propose(tokens: list[int], k: int, max_n: int, min_n: int) -> list[int]:
    """k tokens continuing the most recent earlier occurrence of the longest suffix n-gram (the
    reference for `NgramIndex`, which gives the same answer incrementally)."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        pattern = tokens[length - n :]
        # Scan backwards for the most recent match that is not the suffix itself.
        for start in range(length - n - 1, -1, -1):
            if tokens[start : start + n] == pattern:
                return periodic(tokens, start + n - 1, length, k)
    return []


def periodic(tokens: list[int], end: int, length: int, k: int) -> list[int]:
    """k tokens after `tokens[:length]` when its suffix repeats the n-gram ending at `end`: the tokens
    that followed that n-gram, repeated with period `length - 1 - end` past the known ones."""
    period = length - 1 - end
    return [tokens[end + 1 + i % period] for i in range(k)]


class NgramIndex:
    """For one sequence: the last end position of every n-gram (min_n..max_n) that ends before the
    sequence's last token. Grows with the tokens, so a lookup costs O(new tokens), where a scan costs
    O(length) per step (a millisecond of host time per sequence at a few thousand tokens)."""

    def __init__(self, max_n: int, min_n: int) -> None:
        self.max_n, self.min_n = max_n, min_n
        self.last_end: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # n-grams ending at positions < indexed are in `last_end`

    def propose(self, tokens: list[int], k: int, length: int | None = None) -> list[int]:
        """k tokens continuing the latest earlier match of the suffix of `tokens[:length]` (default:
        all of them), or none when the suffix never occurred before."""
        length = len(tokens) if length is None else length
        if length - 1 < self.indexed:  # the tokens shrank below the index (not expected): rebuild
            self.last_end.clear()
            self.indexed = 0
        for end in range(self.indexed, length - 1):
            for n in range(self.min_n, min(self.max_n, end + 1) + 1):
                self.last_end[tuple(tokens[end - n + 1 : end + 1])] = end
        self.indexed = max(self.indexed, length - 1)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            end = self.last_end.get(tuple(tokens[length - n : length]))
            if end is not None:
                return periodic(tokens, end, length, k)
        return []
