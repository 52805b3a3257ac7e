"""How a worker's cache reaches the router's global prefix index (docs/protocol.md, "Prefix-cache events").

A worker that publishes cache events (prefill and mixed workers) sends each batch of its block
manager's `common.wire.kv_events` events on its PUB socket as a `KVEventBatch`, numbered so that the
router sees a gap; on a gap, or when the worker (re)joins, the router asks for a `Snapshot` of every
hash the worker holds with a `SnapshotRequest`. Importing `common.wire.messages` registers these
messages with the codec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from common.wire.codec import Message
from common.wire.kv_events import KVEvent
from common.wire.wire_fields import Count, Hashes, Id, Positive


@dataclass
class KVEventBatch(Message):
    """Prefill (or mixed) worker PUB socket -> router SUB: the block manager's cache events, applied in
    order; `seq` = previous batch's seq + 1 (the first batch after the process starts is 1)."""

    TYPE: ClassVar[str] = "kv_event_batch"
    worker_id: Id
    seq: Positive
    events: list[KVEvent]


@dataclass
class SnapshotRequest(Message):
    """Router -> prefill worker command socket: send a Snapshot of every block hash you hold."""

    TYPE: ClassVar[str] = "snapshot_request"
    worker_id: Id
    reply_to: str | None = None  # the front that asked: where the answer goes


@dataclass
class Snapshot(Message):
    """Prefill worker -> router inbox: all cached hashes; `seq` = last event batch reflected (0: none)."""

    TYPE: ClassVar[str] = "snapshot"
    worker_id: Id
    seq: Count
    hashes: Hashes
