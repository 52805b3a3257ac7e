"""`flat_sources`: where an eager step launched behind a run-ahead step takes device tokens."""

from __future__ import annotations

from common.core.sequence import Sequence
from common.runner.inputs import flat_sources
from common.wire.sampling_params import SamplingParams


def _scheduled(n_tokens: int, cached: int) -> Sequence:
    seq = Sequence(list(range(1, n_tokens + 1)), SamplingParams(), 16)
    seq.set_cached_prefix(cached)
    seq.schedule(n_tokens - cached)
    return seq


def test_a_source_belongs_to_its_sequences_last_scheduled_token():
    decode, prompt, chunk_end = _scheduled(10, 9), _scheduled(5, 0), _scheduled(7, 4)
    assert flat_sources([decode, prompt, chunk_end], [3, -1, 5]) == [3, -1, -1, -1, -1, -1, -1, -1, 5]


def test_plain_decode_rows_are_the_sources_themselves():
    rows = [2, -1, 0]
    assert flat_sources([_scheduled(4, 3) for _ in rows], rows) is rows
