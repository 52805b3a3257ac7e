"""The event-fed prefix index: chained matching, gaps, snapshots and membership."""

from __future__ import annotations

import pytest

from common.wire.cache_messages import KVEventBatch, Snapshot
from common.wire.hashing import block_hashes
from common.wire.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from router.prefix_index import IndexUpdate, PrefixIndex

BS = 4
PROMPT = list(range(100, 124))  # 6 full blocks
HASHES = block_hashes(PROMPT, BS)


def _ready(index: PrefixIndex, *workers: str) -> None:
    """Join workers and answer their initial snapshot with an empty cache at seq 0."""
    for w in workers:
        index.add_worker(w)
        assert index.apply_snapshot(Snapshot(w, 0, [])) is IndexUpdate.APPLIED


def _batch(worker: str, seq: int, *events: KVEvent) -> KVEventBatch:
    return KVEventBatch(worker, seq, list(events))


def _stored(hashes: list[int], parent: int | None) -> BlockStored:
    return BlockStored(tuple(hashes), parent)


def _removed(hashes: list[int]) -> BlockRemoved:
    return BlockRemoved(tuple(hashes))


def test_match_counts_leading_blocks_per_worker() -> None:
    index = PrefixIndex()
    _ready(index, "a", "b", "c")
    index.apply_batch(_batch("a", 1, _stored(HASHES[:4], None)))
    index.apply_batch(_batch("b", 1, _stored(HASHES[:2], None)))
    index.apply_batch(_batch("c", 1, _stored(HASHES[1:], HASHES[0])))  # no first block: useless
    assert index.match(HASHES) == {"a": 4, "b": 2}
    assert index.match(HASHES[:1]) == {"a": 1, "b": 1}
    assert index.match([]) == {}


def test_match_stops_at_first_miss() -> None:
    index = PrefixIndex()
    _ready(index, "a")
    index.apply_batch(_batch("a", 1, _stored(HASHES, None)))
    index.apply_batch(_batch("a", 2, BlockRemoved((HASHES[2],))))
    assert index.match(HASHES) == {"a": 2}
    other_prompt = block_hashes([1] * 24, BS)
    assert index.match(other_prompt) == {}


def test_removed_and_cleared_keep_owner_map_exact() -> None:
    index = PrefixIndex()
    _ready(index, "a", "b")
    index.apply_batch(_batch("a", 1, _stored(HASHES[:3], None)))
    index.apply_batch(_batch("b", 1, _stored(HASHES[:3], None)))
    assert index.num_unique_blocks == 3
    index.apply_batch(_batch("a", 2, AllBlocksCleared()))
    assert index.match(HASHES) == {"b": 3}
    assert index.num_blocks("a") == 0 and index.num_unique_blocks == 3
    index.apply_batch(_batch("b", 2, _removed(HASHES[:3] + [12345])))  # unknown hash ignored
    assert index.num_unique_blocks == 0


def test_gap_requests_snapshot_and_buffers_until_it_arrives() -> None:
    index = PrefixIndex()
    _ready(index, "a")
    assert index.apply_batch(_batch("a", 1, _stored(HASHES[:1], None))) is IndexUpdate.APPLIED
    # seq 2 is lost; 3 reveals the gap
    assert index.apply_batch(_batch("a", 3, _stored(HASHES[2:3], HASHES[1]))) is IndexUpdate.NEEDS_SNAPSHOT
    assert index.awaiting_snapshot("a")
    assert index.apply_batch(_batch("a", 4, _stored(HASHES[3:4], HASHES[2]))) is IndexUpdate.BUFFERED
    # stale state keeps serving matches meanwhile
    assert index.match(HASHES) == {"a": 1}
    # the snapshot reflects batches up to 3; only batch 4 is replayed on top
    assert index.apply_snapshot(Snapshot("a", 3, HASHES[:3])) is IndexUpdate.APPLIED
    assert not index.awaiting_snapshot("a")
    assert index.match(HASHES) == {"a": 4}
    assert index.apply_batch(_batch("a", 5, _removed(HASHES[3:4]))) is IndexUpdate.APPLIED
    assert index.match(HASHES) == {"a": 3}


def test_snapshot_followed_by_a_hole_needs_another_snapshot() -> None:
    index = PrefixIndex()
    index.add_worker("a")
    index.apply_batch(_batch("a", 7, _stored(HASHES[:1], None)))  # snapshot will say 5: 6 is missing
    assert index.apply_snapshot(Snapshot("a", 5, [])) is IndexUpdate.NEEDS_SNAPSHOT
    assert index.awaiting_snapshot("a")
    assert index.apply_snapshot(Snapshot("a", 7, HASHES[:1])) is IndexUpdate.APPLIED
    assert index.match(HASHES) == {"a": 1}


def test_events_arriving_before_the_join_snapshot_are_replayed() -> None:
    index = PrefixIndex()
    index.add_worker("a")
    assert index.apply_batch(_batch("a", 1, _stored(HASHES[:2], None))) is IndexUpdate.BUFFERED
    assert index.apply_batch(_batch("a", 2, _stored(HASHES[2:3], HASHES[1]))) is IndexUpdate.BUFFERED
    assert index.apply_snapshot(Snapshot("a", 1, HASHES[:2])) is IndexUpdate.APPLIED
    assert index.match(HASHES) == {"a": 3}


def test_unsolicited_snapshot_and_unknown_worker_are_ignored() -> None:
    index = PrefixIndex()
    _ready(index, "a")
    index.apply_batch(_batch("a", 1, _stored(HASHES[:2], None)))
    assert index.apply_snapshot(Snapshot("a", 0, [])) is IndexUpdate.IGNORED
    assert index.match(HASHES) == {"a": 2}
    assert index.apply_batch(_batch("zzz", 1, _stored(HASHES, None))) is IndexUpdate.IGNORED
    assert index.apply_snapshot(Snapshot("zzz", 0, HASHES)) is IndexUpdate.IGNORED


def test_rejoin_and_remove_forget_the_worker() -> None:
    index = PrefixIndex()
    _ready(index, "a", "b")
    index.apply_batch(_batch("a", 1, _stored(HASHES, None)))
    index.apply_batch(_batch("b", 1, _stored(HASHES[:1], None)))
    index.add_worker("a")  # a restart: nothing known until its snapshot
    assert index.awaiting_snapshot("a")
    assert index.match(HASHES) == {"b": 1}
    index.remove_worker("b")
    assert index.match(HASHES) == {} and index.num_unique_blocks == 0
    assert index.worker_ids == ["a"]


def test_buffer_is_bounded_and_overflow_forces_a_new_snapshot() -> None:
    index = PrefixIndex(max_buffered_batches=2)
    index.add_worker("a")
    for seq in (1, 2, 3):
        index.apply_batch(_batch("a", seq, _stored([seq], None)))
    assert [s.num_buffered_batches for s in index.stats()] == [2]
    assert index.apply_snapshot(Snapshot("a", 0, [])) is IndexUpdate.NEEDS_SNAPSHOT  # batch 1 was dropped


def test_rejects_bad_buffer_bound() -> None:
    with pytest.raises(ValueError, match="max_buffered_batches"):
        PrefixIndex(max_buffered_batches=0)
