"""The exact, event-fed global prefix index: which worker (prefill or mixed) holds which block hash.

Invariants:
- `_owners[h]` is exactly the set of workers whose `hashes` contain h (no empty sets are kept).
- A worker's state reflects its event batches 1..last_seq applied in order, or a snapshot taken at
  some seq followed by batches seq+1..last_seq.

Gaps and (re)joins: when a batch's seq is not last_seq + 1, or when a worker (re)joins, the worker is
marked `awaiting_snapshot` and the caller sends it a SnapshotRequest. While waiting, incoming batches
are BUFFERED (bounded; the oldest are dropped past the bound) rather than dropped, because the
snapshot and the events travel on different sockets and either may arrive first: when the snapshot
comes, buffered batches with seq <= snapshot.seq are discarded and the rest are replayed in order; a
hole among them means another snapshot. Meanwhile matching keeps using the worker's last known
(possibly stale) hashes: a wrong guess only costs routing quality, never correctness, because a
prefill worker computes whatever it does not have cached.

Pure data structure: no sockets, no clocks. Events are the `common.wire.kv_events` classes.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from common.wire.cache_messages import KVEventBatch, Snapshot
from common.wire.kv_events import BlockRemoved, BlockStored


class IndexUpdate(enum.Enum):
    """What happened to an event batch or snapshot handed to the index."""

    APPLIED = "applied"
    BUFFERED = "buffered"  # waiting for a snapshot; kept for replay
    NEEDS_SNAPSHOT = "needs_snapshot"  # a gap was found just now: the caller must request a snapshot
    IGNORED = "ignored"  # unknown worker, or a snapshot nobody is waiting for


@dataclass
class _WorkerState:
    hashes: set[int] = field(default_factory=set)
    last_seq: int = 0
    awaiting_snapshot: bool = True
    buffered: dict[int, KVEventBatch] = field(default_factory=dict)  # seq -> batch


@dataclass(frozen=True)
class WorkerIndexStats:
    worker_id: str
    num_blocks: int
    last_seq: int
    awaiting_snapshot: bool
    num_buffered_batches: int


class PrefixIndex:
    def __init__(self, max_buffered_batches: int = 4096) -> None:
        if max_buffered_batches < 1:
            raise ValueError(f"max_buffered_batches must be >= 1, got {max_buffered_batches}")
        self._max_buffered = max_buffered_batches
        self._workers: dict[str, _WorkerState] = {}
        self._owners: dict[int, set[str]] = {}

    # ---- membership ---------------------------------------------------------------------------

    def add_worker(self, worker_id: str) -> None:
        """(Re)join: forget what we knew and wait for a snapshot (the caller requests it)."""
        self.remove_worker(worker_id)
        self._workers[worker_id] = _WorkerState()

    def remove_worker(self, worker_id: str) -> None:
        state = self._workers.pop(worker_id, None)
        if state is not None:
            self._forget(worker_id, state.hashes)

    def reset_worker(self, worker_id: str) -> None:
        """Drop a worker's hashes and wait for a snapshot (e.g. after it was unreachable)."""
        if worker_id in self._workers:
            self.add_worker(worker_id)

    def awaiting_snapshot(self, worker_id: str) -> bool:
        state = self._workers.get(worker_id)
        return state is not None and state.awaiting_snapshot

    @property
    def worker_ids(self) -> list[str]:
        return list(self._workers)

    # ---- updates -------------------------------------------------------------------------------

    def apply_batch(self, batch: KVEventBatch) -> IndexUpdate:
        state = self._workers.get(batch.worker_id)
        if state is None:
            return IndexUpdate.IGNORED
        if state.awaiting_snapshot:
            self._buffer(state, batch)
            return IndexUpdate.BUFFERED
        if batch.seq != state.last_seq + 1:
            state.awaiting_snapshot = True
            self._buffer(state, batch)
            return IndexUpdate.NEEDS_SNAPSHOT
        self._apply_events(batch.worker_id, state, batch)
        return IndexUpdate.APPLIED

    def apply_snapshot(self, snapshot: Snapshot) -> IndexUpdate:
        """Replace the worker's hashes, then replay the buffered batches that follow the snapshot."""
        state = self._workers.get(snapshot.worker_id)
        if state is None or not state.awaiting_snapshot:
            return IndexUpdate.IGNORED  # e.g. the answer to a retried request we already satisfied
        self._forget(snapshot.worker_id, state.hashes)
        state.hashes = set()
        self._remember(snapshot.worker_id, state, snapshot.hashes)
        state.last_seq = snapshot.seq
        state.awaiting_snapshot = False
        pending, state.buffered = state.buffered, {}
        for seq in sorted(s for s in pending if s > snapshot.seq):
            if seq != state.last_seq + 1:
                state.awaiting_snapshot = True
                state.buffered = {s: pending[s] for s in pending if s >= seq}
                return IndexUpdate.NEEDS_SNAPSHOT
            self._apply_events(snapshot.worker_id, state, pending[seq])
        return IndexUpdate.APPLIED

    def _buffer(self, state: _WorkerState, batch: KVEventBatch) -> None:
        state.buffered[batch.seq] = batch
        if len(state.buffered) > self._max_buffered:
            del state.buffered[min(state.buffered)]  # replay will then see a hole and re-snapshot

    def _apply_events(self, worker_id: str, state: _WorkerState, batch: KVEventBatch) -> None:
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._remember(worker_id, state, event.hashes)
            elif isinstance(event, BlockRemoved):
                gone = state.hashes.intersection(event.hashes)
                state.hashes -= gone
                self._forget(worker_id, gone)
            else:  # AllBlocksCleared
                self._forget(worker_id, state.hashes)
                state.hashes = set()
        state.last_seq = batch.seq

    def _remember(self, worker_id: str, state: _WorkerState, hashes: Sequence[int]) -> None:
        for h in hashes:
            state.hashes.add(h)
            self._owners.setdefault(h, set()).add(worker_id)

    def _forget(self, worker_id: str, hashes: set[int]) -> None:
        for h in hashes:
            owners = self._owners.get(h)
            if owners is not None:
                owners.discard(worker_id)
                if not owners:
                    del self._owners[h]

    # ---- queries -------------------------------------------------------------------------------

    def match(self, hashes: Sequence[int]) -> dict[str, int]:
        """Per worker, how many leading blocks of this hash chain it holds (workers with 0 omitted).

        Hashes are chained, so holding block i means holding the same prefix 0..i; the walk stops
        for each worker at its first miss and ends as soon as no worker is left.
        """
        result: dict[str, int] = {}
        alive = set(self._owners.get(hashes[0], ())) if hashes else set()
        for i in range(1, len(hashes)):
            if not alive:
                break
            holders = self._owners.get(hashes[i], set())
            for worker_id in alive - holders:
                result[worker_id] = i
            alive &= holders
        for worker_id in alive:
            result[worker_id] = len(hashes)
        return result

    def num_blocks(self, worker_id: str) -> int:
        state = self._workers.get(worker_id)
        return len(state.hashes) if state else 0

    @property
    def num_unique_blocks(self) -> int:
        return len(self._owners)

    def stats(self) -> list[WorkerIndexStats]:
        return [
            WorkerIndexStats(w, len(s.hashes), s.last_seq, s.awaiting_snapshot, len(s.buffered))
            for w, s in self._workers.items()
        ]
