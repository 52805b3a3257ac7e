"""Prefix-cache events to the router: numbered batches (1, 2, ...) and snapshots that name the last
batch they reflect, as the protocol in docs/protocol.md asks. Used by every role that publishes
its cache (prefill and mixed workers)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from common.wire.cache_messages import KVEventBatch, Snapshot
from common.wire.codec import build_checked_parts
from common.wire.kv_events import KVEvent

if TYPE_CHECKING:
    from common.worker.channels import WorkerChannels
    from common.worker.io_process import ProcessChannels


class EventPublisher:
    def __init__(self, worker_id: str, channels: WorkerChannels | ProcessChannels) -> None:
        self.worker_id = worker_id
        self.channels = channels
        self.seq = 0  # the last batch published

    def flush(self, events: list[KVEvent]) -> None:
        """Publish `events` (drained from the engine) as the next batch; nothing when empty."""
        if not events:
            return
        self.seq += 1
        # Built without the per-field checks: the events are this engine's own (a check of each event's
        # hashes cost ~65 us per batch of 25 on the worker's hot path); the router decodes with all of them.
        batch = build_checked_parts(KVEventBatch, worker_id=self.worker_id, seq=self.seq, events=list(events))
        self.channels.publish(batch)

    def snapshot(self, pending: list[KVEvent], hashes: list[int], reply_to: str | None) -> None:
        """Answer a SnapshotRequest from the front at `reply_to`. Events not yet published are published
        first (every front gets them), so `hashes` (the cache as it is now) reflects exactly the batches
        up to `seq`."""
        self.flush(pending)
        self.channels.to_front(reply_to, Snapshot(self.worker_id, self.seq, hashes))
