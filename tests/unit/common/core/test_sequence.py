"""Sequence verbs: the cache counters, drafts and run-ahead placeholders keep their invariants."""

from __future__ import annotations

import pytest

from common.core.sequence import PLACEHOLDER, Sequence
from common.wire.hashing import block_hashes
from common.wire.sampling_params import SamplingParams

BS = 4


def _seq(n: int) -> Sequence:
    return Sequence(list(range(10, 10 + n)), SamplingParams(), BS)


def _invariants(seq: Sequence) -> None:
    assert 0 <= seq.num_cached_tokens + seq.num_scheduled_tokens <= len(seq)
    assert seq.block_hashes == block_hashes(seq.token_ids, BS)[: len(seq.block_hashes)]
    assert 0 <= seq.num_known_tokens <= len(seq)


def test_schedule_and_commit():
    seq = _seq(10)
    seq.schedule(6)
    assert seq.num_uncomputed_tokens == 10 and seq.num_scheduled_tokens == 6
    seq.commit_scheduled()
    assert seq.num_cached_tokens == 6 and seq.num_scheduled_tokens == 0
    with pytest.raises(ValueError, match="num_tokens"):
        seq.schedule(5)  # only 4 tokens are left to compute
    with pytest.raises(ValueError, match="num_tokens"):
        seq.set_cached_prefix(11)
    _invariants(seq)


def test_truncate_shrinks_cache_and_hashes():
    seq = _seq(12)
    seq.schedule(12)
    seq.commit_scheduled()
    assert len(seq.full_block_hashes()) == 3
    seq.truncate(6)
    assert seq.token_ids == list(range(10, 16)) and seq.num_cached_tokens == 6
    assert len(seq.block_hashes) == 1  # only block 0 is still full
    _invariants(seq)
    seq.truncate(9)  # longer than the sequence: nothing changes
    assert len(seq) == 6


def test_rollback_cache_moves_only_the_counter():
    seq = _seq(10)
    seq.schedule(10)
    seq.commit_scheduled()
    seq.rollback_cache(7)
    assert seq.num_cached_tokens == 7 and len(seq) == 10
    seq.rollback_cache(9)  # never moves forward
    assert seq.num_cached_tokens == 7


def test_drafts_kept_dropped_and_rolled_back():
    seq = _seq(8)
    seq.schedule(7)
    seq.commit_scheduled()  # a decoding sequence: its last token is uncomputed
    seq.add_drafts([1, 2, 3])
    seq.schedule(4)  # the last real token + 3 drafts, verified in one pass
    seq.keep_drafts(2)
    assert seq.token_ids[-2:] == [1, 2] and seq.num_draft_tokens == 0
    assert seq.num_cached_tokens == 10 and len(seq) == 10  # accepted drafts keep their KV
    _invariants(seq)
    seq.add_drafts([4, 5])
    seq.drop_drafts()
    assert len(seq) == 10 and seq.num_draft_tokens == 0


def test_placeholders_resolve_in_order_and_truncate_drops_them():
    seq = _seq(5)
    seq.schedule(5)
    seq.commit_scheduled()
    seq.append_placeholder()
    assert seq.token_ids[-1] == PLACEHOLDER and seq.completion_token_ids == []
    assert seq.resolve_placeholder(42) == 5
    assert seq.completion_token_ids == [42] and seq.num_pending_tokens == 0
    with pytest.raises(ValueError, match="placeholder"):
        seq.resolve_placeholder(1)
    seq.append_placeholder()
    seq.truncate(6)  # an aborted sequence drops its in-flight token
    assert seq.num_pending_tokens == 0 and PLACEHOLDER not in seq.token_ids


def test_drafts_after_a_placeholder():
    """Drafts proposed one step behind follow the run-ahead placeholder: it resolves in place, a
    stop at it drops the drafts, and neither counts as a known completion token."""
    seq = _seq(5)
    seq.schedule(5)
    seq.commit_scheduled()
    seq.append_placeholder()
    seq.add_drafts([7, 8])
    assert seq.num_known_tokens == 5 and seq.completion_token_ids == []
    assert seq.resolve_placeholder(42) == 5
    assert seq.token_ids[5:] == [42, 7, 8] and seq.num_draft_tokens == 2
    assert seq.completion_token_ids == [42] and seq.num_known_tokens == 6
    seq.truncate(6)  # a stop at the placeholder's token drops the drafts after it
    assert seq.num_draft_tokens == 0 and seq.token_ids[-1] == 42
    seq.append_placeholder()
    seq.add_drafts([9, 9])
    seq.truncate(7)  # the drafts go first from the end, then the placeholder
    assert (seq.num_pending_tokens, seq.num_draft_tokens) == (1, 0)
    seq.truncate(6)
    assert seq.num_pending_tokens == 0 and PLACEHOLDER not in seq.token_ids
